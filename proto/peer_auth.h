/* proto/peer_auth.h — how a peer proves it holds a job's key (peer
 * protocol 5, proto/peer_protocol.h).
 *
 * The key is BLAKE2b-256 of "dted-job", the job name and its token, each
 * NUL-terminated: every daemon the user gave the token derives it, and
 * nothing on the wire shows it.  Every job record (field 1 is its JobRef)
 * carries JobRef.mac, and a REFUSED of a job the refuser holds carries
 * Refused.mac: a random 192-bit nonce and a Poly1305 tag (peer protocol
 * 9) under the one-time key XChaCha20(job key, nonce) — the first 32
 * bytes of its keystream, as XChaCha20-Poly1305 makes its tag key — over
 * a domain tag, the record type, the record packed with an empty mac
 * and, for PAYLOAD, the data's length and bytes.  (Protocol 5..8 used
 * keyed BLAKE2b-256, about 3.5x slower per byte: a relay checks every part
 * it forwards, docs/BENCHMARKS.md "Relay fan-out, modelled".)  A RELAYED's MAC covers
 * its header alone: its data is a record sealed by its source with that
 * record's data, whose own MAC covers them (protocol 7; hashing every
 * relayed byte again would cost a relay what its check costs).  The receiver repacks
 * what it decoded with the mac emptied and compares in constant time, so
 * what it checks is exactly what it then reads.  The token must be
 * guessable by no one: the key is no stronger than the token.
 */
#ifndef DTE_PEER_AUTH_H
#define DTE_PEER_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include "proto/peer.pb-c.h"

#define PEER_AUTH_KEYBYTES   32u
#define PEER_AUTH_MAC_NONCEBYTES 24u   /* crypto_stream_xchacha20_NONCEBYTES */
#define PEER_AUTH_TAGBYTES   16u       /* crypto_onetimeauth_BYTES */
#define PEER_AUTH_MACBYTES   (PEER_AUTH_MAC_NONCEBYTES + PEER_AUTH_TAGBYTES)
#define PEER_AUTH_NONCEBYTES 16u

/* sodium_init; 0 or -EIO.  Safe to call more than once. */
int peer_auth_init(void);

/* The job key of (job, token). */
void peer_auth_key(uint8_t key[PEER_AUTH_KEYBYTES], const char *job, const char *token);

/* Random bytes (a JOIN nonce). */
void peer_auth_random(void *buf, size_t len);

/* The JobRef of a job record (field 1), NULL for records without one
 * (REFUSED) or without it set. */
Dtep__JobRef *peer_auth_ref(const ProtobufCMessage *msg);

/* Where a record's MAC goes: its JobRef's mac, or a REFUSED's own mac;
 * NULL for a record with neither. */
ProtobufCBinaryData *peer_auth_mac_field(const ProtobufCMessage *msg);

/* The MAC of a record, a fresh nonce and its tag (its MAC field is
 * ignored: emptied for the computation, then restored).  0 or -ENOMEM. */
int peer_auth_mac(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type,
		  const ProtobufCMessage *msg, const void *data, size_t len,
		  uint8_t mac[PEER_AUTH_MACBYTES]);

/* Seal a record: its JobRef's token emptied and mac set to `macbuf`
 * (caller's storage, filled here; it must outlive the packing of msg).
 * 0, -EINVAL (no JobRef) or -ENOMEM. */
int peer_auth_seal(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type, ProtobufCMessage *msg,
		   const void *data, size_t len, uint8_t macbuf[PEER_AUTH_MACBYTES]);

/* Check a received record's MAC: 0 when it verifies, -ENOKEY when the
 * record carries none (or one of the wrong size), -EBADMSG when it does
 * not verify, -EINVAL without a MAC field, -ENOMEM. */
int peer_auth_check(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type,
		    const ProtobufCMessage *msg, const void *data, size_t len);

#endif
