/* proto/peer_protocol.h — the peer protocol between dted daemons: its
 * version, the versions a daemon accepts, and the rules of the control
 * records (JOIN, PLAN, PLAN_ACK) that proto/peer.proto cannot say.
 *
 * The records themselves are proto/peer.proto (one UCX active message
 * each, AM id = PeerMsgType).  docs/SYNC.md draws the coordinator's
 * membership and plan-term state machine.
 *
 * ## Versions
 * JOIN and PLAN carry peer_proto, the sender's PEER_PROTO_VERSION.  A
 * coordinator refuses a JOIN, and a member a PLAN, whose peer_proto is
 * outside [PEER_PROTO_MIN_VERSION, PEER_PROTO_VERSION], with the reason
 * (0 means a daemon from before the field: protocol 1).  Bump
 * PEER_PROTO_VERSION when an existing message changes meaning; raise
 * PEER_PROTO_MIN_VERSION when this daemon can no longer serve a peer of
 * the old version.  New fields stay additive in peer.proto.
 *
 *   1  dted 0.1.0  JOIN, LEAVE, PLAN, COUNTS, PAYLOAD, STAGED, APPLIED.
 *   2  a pair's payload goes in parts while the source still detects:
 *      PAYLOAD names its part and entry range, COUNTS goes last and names
 *      how many parts make up payload_bytes.  JOIN and PLAN carry
 *      peer_proto.
 *   3  COUNTS' partial checksums are sum key(i)*bf16(i) (gpu/elem.h,
 *      dtc_csum_term), no longer splitmix64 per element: a v2 sink would
 *      fail every version's checksum.  (main, 7472cb3)
 *   4  control records survive restarts and losses:
 *      - a plan epoch is a term (below), not a per-process counter from 0;
 *      - JOIN carries (join_boot, join_seq); the coordinator answers every
 *        JOIN with a PLAN echoing join_seq (the JOIN's acknowledgement);
 *      - PLAN_ACK (new type 9) acknowledges a PLAN's term;
 *      - JOIN and PLAN are retried with backoff until acknowledged;
 *      - a member takes PLANs only from the job's coordinator.
 *      An older daemon reads a term as an epoch and never acknowledges,
 *      so the supported range is 4..4.
 *   (4, additive) PAYLOAD also carries its entries' counts, the mode
 *      and (sparse) base_version, so a parked sink swaps it in before
 *      COUNTS; a sink that ignores them, or a part without them, waits
 *      for COUNTS as before.
 *   5  peers prove the job key, the token never crosses the wire
 *      (proto/peer_auth.h): JobRef.token is empty and JobRef.mac is a
 *      keyed BLAKE2b over the record and, for PAYLOAD, its data; JOIN
 *      carries the member's nonce, every PLAN to it echoes it
 *      (join_nonce).  A v4 daemon sends tokens and no MAC: 5..5.
 *      With auth = off on a job both ends send the token as in 4.
 *   6  Entry.fp8 (issue 33): an entry into an FP8 sink moves 16-bit
 *      units the source computes with the engine's quantizer from the
 *      element box src_extent (daemon/layout/plan.h, dte_fp8_split).  A
 *      v5 daemon would read such an entry's unit map as BF16 elements of
 *      the source: 6..6.
 *   7  relay between sink daemons (issue 34): Participant.relay_parent and
 *      relay_root, COUNTS/PAYLOAD.relay_direct, RELAYED (new type 10, a
 *      COUNTS or PAYLOAD forwarded unchanged, its data after it).  A v6
 *      source would send to every replica and a v6 sink would drop what a
 *      relay forwards: 7..7.
 *   8  a PLAN carries only what changed (issue 34, "re-planned
 *      incrementally"): to a member whose last PLAN it acknowledged and
 *      whose pairs that are gone all end at a participant gone, the
 *      coordinator sends base_epoch (that PLAN's term), drop (the
 *      participants gone, with their pairs) and only the participants,
 *      pairs (whole) and addresses that are new or changed.  The member
 *      takes it only on the plan of base_epoch; otherwise it takes
 *      nothing, does not acknowledge it, and JOINs again: the coordinator
 *      answers a new JOIN with a whole PLAN.  A v7 member would take a
 *      delta for the whole plan: 8..8.
 *   9  a record's MAC is a random 192-bit nonce and a Poly1305 tag under
 *      the one-time key XChaCha20(job key, nonce) (proto/peer_auth.h),
 *      40 bytes in JobRef.mac / Refused.mac, instead of keyed BLAKE2b-256
 *      (32): about 3.5x less CPU per byte for every PAYLOAD sealed and
 *      checked, a relay's check of each part it forwards among them.  A
 *      v8 daemon refuses every v9 record's MAC: 9..9.
 *  10  RATES (new type 11, member -> coordinator): the member's measured
 *      send rate toward each node it sent parts to in the job, and the
 *      bytes of its sources' recent pair-versions, for the relay shape
 *      ([peer] relay_shape = measured; docs/SYNC.md), and what its sources
 *      know of the sinks they feed (seen: staged, sent under its term),
 *      for the relay lag check.  Sent only while its plan has relay
 *      trees.  Additive: a member
 *      sends RATES only to a coordinator whose PLAN says 10 or more, and
 *      a v10 coordinator plans a v9 member's links as unmeasured: 9..10.
 *
 * ## Terms (PLAN.epoch, COUNTS.epoch, PAYLOAD.epoch)
 *   epoch = boot << PEER_TERM_COUNTER_BITS | counter
 * boot is PEER_TERM_BOOT_BITS random bits (never 0) the coordinator draws
 * when it creates the job, so every coordinator process (a restart, a
 * re-created job) plans under a boot of its own; counter counts that
 * boot's plans from 1.  A counter that would overflow draws a new boot.
 * Terms are below 2^63 (JSON tools that hold integers as int64).
 *   - Same boot: the larger counter is newer.
 *   - Another boot: the new coordinator supersedes the old one; the member
 *     retires the old boot (the last PEER_TERM_RETIRED kept) and refuses
 *     any later PLAN of a retired boot.
 * Data records are taken under the term held only: a sink refuses COUNTS
 * and PAYLOAD of an older term, so a version in flight under the old term
 * is refused cleanly and its source sends the next version dense.  A
 * record of a newer term (one whose PLAN the member would adopt: the
 * records and the PLAN travel separately and overtake each other) waits
 * for that PLAN, bounded in records, bytes and time
 * (daemon/job_sink_intake.c), and goes in once it is adopted; one
 * still waiting after PEER_RETRY_MAX_MS makes the member send its JOIN
 * again (a duplicate, answered with the current PLAN), at most once per
 * PEER_RETRY_MAX_MS: past its deadline the PLAN goes only every
 * PEER_PLAN_SLOW_MS.
 *
 * ## Acknowledgement and retry
 * JOIN: retried while the member has not seen a PLAN echoing its newest
 * join_seq, first after PEER_RETRY_FIRST_MS, doubling to PEER_RETRY_MAX_MS,
 * for as long as the member has participants (membership must converge;
 * an attach waiting on it has its own deadline).  A member that hears its
 * coordinator go down marks its JOIN unacknowledged: it rejoins when the
 * coordinator is back, without operator action.
 * PLAN: retried to a member until it acknowledges the term (PLAN_ACK),
 * same backoff, until PEER_PLAN_DEADLINE_MS after the plan was made; then
 * the coordinator logs it and from there sends it every
 * PEER_PLAN_SLOW_MS until the member acknowledges it, leaves or goes down
 * (a partition nobody is told of ends with the member on the current
 * term even when no record reaches it to make it ask).
 * Duplicates are idempotent: a JOIN with a join_seq already processed for
 * that join_boot is answered with the current PLAN and changes nothing; a
 * PLAN of the member's current term is acknowledged again and changes
 * nothing; a PLAN_ACK of a term not current is ignored.
 */
#ifndef DTE_PEER_PROTOCOL_H
#define DTE_PEER_PROTOCOL_H

#include <stdint.h>

#define PEER_PROTO_VERSION     10u
#define PEER_PROTO_MIN_VERSION 9u

#define PEER_TERM_COUNTER_BITS 24
#define PEER_TERM_BOOT_BITS    39
#define PEER_TERM_RETIRED      8

#define PEER_RETRY_FIRST_MS    200u
#define PEER_RETRY_MAX_MS      3200u
#define PEER_PLAN_DEADLINE_MS  60000u
#define PEER_PLAN_SLOW_MS      30000u
/* A member's RATES (version 10) go at most this often. */
#define PEER_RATES_MIN_MS      250u
/* The first version that has RATES. */
#define PEER_PROTO_RATES       10u

static inline uint64_t peer_term(uint64_t boot, uint64_t counter)
{
	return boot << PEER_TERM_COUNTER_BITS | counter;
}

static inline uint64_t peer_term_boot(uint64_t term)
{
	return term >> PEER_TERM_COUNTER_BITS;
}

static inline uint64_t peer_term_counter(uint64_t term)
{
	return term & ((1ull << PEER_TERM_COUNTER_BITS) - 1);
}

static inline int peer_proto_supported(uint32_t v)
{
	return v >= PEER_PROTO_MIN_VERSION && v <= PEER_PROTO_VERSION;
}

#endif
