/* tests/bench/bench_peer_auth.c — what peer auth costs per PAYLOAD part
 * (proto/peer_auth.h): the MAC of a part (header + data; protocol 9's
 * Poly1305 under a one-time XChaCha20 key) as a source seals it and a
 * sink checks it, against the MAC protocols 5..8 used (keyed BLAKE2b-256,
 * libsodium crypto_generichash over the same bytes: the baseline) and
 * XXH3 of the same data (the part's integrity hash, computed anyway), at
 * the default sparse part size and at a dense part's; the three
 * interleaved, best of 5 rounds each (a shared machine).  One line per
 * size:
 *   bench peer-auth bytes=N mac_us=.. mac_GBps=.. blake2b_us=.. speedup=..
 *   xxh3_GBps=..
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sodium.h>
#include <xxhash.h>
#include "proto/peer_auth.h"
#include "tests/bench/fanout_check.h"

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 4096, 256 << 10, 8 << 20, 32 << 20 };
	uint8_t key[PEER_AUTH_KEYBYTES], mac[PEER_AUTH_MACBYTES];
	size_t maxn = sizes[sizeof(sizes) / sizeof(sizes[0]) - 1];
	uint8_t *data = malloc(maxn);
	volatile uint64_t sink = 0;

	if (!data || peer_auth_init() < 0)
		return 1;
	for (size_t i = 0; i < maxn; i++)
		data[i] = (uint8_t)(i * 131 + 7);
	peer_auth_key(key, "bench", "bench-token");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		unsigned reps = (unsigned)((256u << 20) / n);
		Dtep__Payload m = DTEP__PAYLOAD__INIT;
		Dtep__JobRef ref = DTEP__JOB_REF__INIT;
		double t0, tm = 1e9, tx = 1e9, tb = 1e9, t;

		bench_sample_payload(&m, &ref);
		m.xxh3 = XXH3_64bits(data, n);
		if (reps < 4)
			reps = 4;
		peer_auth_mac(key, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m.base, data, n, mac);
		for (int round = 0; round < 5; round++) {
			t0 = now();
			for (unsigned r = 0; r < reps; r++) {
				m.part = r;
				peer_auth_mac(key, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m.base,
					      data, n, mac);
				sink += mac[0];
			}
			if ((t = (now() - t0) / reps) < tm)
				tm = t;
			t0 = now();
			for (unsigned r = 0; r < reps; r++) {
				data[0] = (uint8_t)r;
				crypto_generichash(mac, 32, data, n, key, PEER_AUTH_KEYBYTES);
				sink += mac[0];
			}
			if ((t = (now() - t0) / reps) < tb)
				tb = t;
			t0 = now();
			for (unsigned r = 0; r < reps; r++)
				sink += XXH3_64bits(data, n);
			if ((t = (now() - t0) / reps) < tx)
				tx = t;
		}
		printf("bench peer-auth bytes=%zu mac_us=%.1f mac_GBps=%.2f blake2b_us=%.1f "
		       "speedup=%.2f xxh3_GBps=%.2f\n", n, tm * 1e6, (double)n / tm / 1e9,
		       tb * 1e6, tb / tm, (double)n / tx / 1e9);
	}
	free(data);
	return sink == 42 ? 2 : 0;
}
