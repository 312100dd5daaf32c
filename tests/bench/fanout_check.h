/* tests/bench/fanout_check.h — what a relay's check of one PAYLOAD part
 * costs on this machine, measured as the data path does it
 * (daemon/job_sink_intake.c, relay_forward: the record's MAC checked
 * where it comes in, proto/peer_auth.h; the raw chunk's XXH3), and the
 * keyed BLAKE2b of protocols 5..8 for comparison.  Shared by the fan-out
 * benches (bench_fanout_sim.c, bench_fanout_fixture.c) and
 * bench_peer_auth.c. */
#ifndef DTE_BENCH_FANOUT_CHECK_H
#define DTE_BENCH_FANOUT_CHECK_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <xxhash.h>
#include <sodium.h>
#include "proto/peer_auth.h"

static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A PAYLOAD header as a source fills one (job, epoch, version, ends),
 * for the benches that MAC a part. */
static inline void bench_sample_payload(Dtep__Payload *m, Dtep__JobRef *ref)
{
	ref->job = "bench";
	m->job = ref;
	m->epoch = 0x159acf74ad000005ull;
	m->version = 1234;
	m->src = 0x716a8f6500000001ull;
	m->dst = 0x3e7850e300000002ull;
}

static inline double median9(double *t)
{
	for (int i = 1; i < 9; i++)
		for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
			double x = t[j];
			t[j] = t[j - 1];
			t[j - 1] = x;
		}
	return t[4];
}

/* A relay's check of one part, in seconds (median of 9 rounds of 64):
 * the chunk's XXH3, and the record's MAC (once to check it, once to seal
 * it again for the next hop's address: the MAC covers src and dst). */
static inline int verify_cost(size_t n, double *xxh3_s, double *mac_s, double *mac8_s)
{
	uint8_t key[PEER_AUTH_KEYBYTES], mac[PEER_AUTH_MACBYTES], *data = malloc(n);
	double tx[9], tm[9], t8[9];
	volatile uint64_t sink = 0;

	if (!data || peer_auth_init() < 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)(i * 131 + 7);
	peer_auth_key(key, "bench", "bench-token");
	for (int r = 0; r < 9; r++) {
		Dtep__Payload m = DTEP__PAYLOAD__INIT;
		Dtep__JobRef ref = DTEP__JOB_REF__INIT;
		const unsigned reps = 64;
		double t0;

		bench_sample_payload(&m, &ref);
		t0 = now();
		for (unsigned k = 0; k < reps; k++)
			sink += XXH3_64bits(data, n) + k;
		tx[r] = (now() - t0) / reps;
		t0 = now();
		for (unsigned k = 0; k < reps; k++) {
			m.part = k;
			peer_auth_mac(key, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m.base, data, n, mac);
			sink += mac[0];
		}
		tm[r] = (now() - t0) / reps;
		/* The baseline: protocol 5..8's MAC, keyed BLAKE2b-256 over
		 * the same bytes (libsodium, one call: no cheaper than the
		 * streaming one it used). */
		t0 = now();
		for (unsigned k = 0; k < reps; k++) {
			data[0] = (uint8_t)k;
			crypto_generichash(mac, 32, data, n, key, PEER_AUTH_KEYBYTES);
			sink += mac[0];
		}
		t8[r] = (now() - t0) / reps;
	}
	free(data);
	*xxh3_s = median9(tx);
	*mac_s = median9(tm);
	*mac8_s = median9(t8);
	return sink == 42 ? -1 : 0;
}

#endif
