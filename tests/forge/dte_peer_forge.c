/* dte-peer-forge — a misbehaving peer for tests: sends crafted peer.proto
 * records to a dted and prints what comes back.
 *
 *   dte-peer-forge --to HOST:PORT [--node NAME] [--wait-ms MS]
 *                  [--expect N] RECORD [RECORD...]
 *
 * Each RECORD is one shell argument: a type and key=value fields,
 *   "counts job=J token=T epoch=E version=V base=B mode=sparse|dense
 *           src=S dst=D counts=1,0,7 checksums=BUF:PARTIAL,.. payload_bytes=N
 *           [parts=N]"         (parts default: 1 when payload_bytes, else 0)
 *   "payload job=J token=T epoch=E version=V src=S dst=D encoding=N
 *           [xxh3=N] [data=@FILE] [entries=P,P,..;P,..] [box=N] [value=HEX]
 *           [chunk=ZLEVEL] [truncate=N] [corrupt=OFFSET]
 *           [part=N] [first_entry=N] [part_entries=N]"
 *                                     (one part 0 over every entry of the
 *                                      last COUNTS sent, unless given)
 *   "join job=J token=T node=N address=A spec_hash=H [peer_proto=N]
 *          [join_boot=B join_seq=S]"  (peer_proto default: this build's)
 *   "leave job=J token=T node=N participants=1,2"
 *   "plan job=J token=T epoch=E [peer_proto=N] [join_seq=S]"
 *                                     (no participants, no entries)
 *   "staged job=J token=T version=V src=S dst=D"
 *   "applied job=J token=T version=V dst=D result=N message=TEXT"
 *   "refused job=J token=T [type=N] reason=TEXT"
 *                                     (a refusal of our record of type N,
 *                                      default JOIN: sealed under (J, T),
 *                                      token= empty: no MAC)
 *   "raw type=N hex=0a03..."          (bytes no encoder would produce)
 *   "encode out=FILE [entries=..] [box=..] [chunk=..] [truncate=..] [corrupt=..]"
 *                                     (payload data into FILE, nothing sent:
 *                                      its size is the COUNTS' payload_bytes)
 *   "sleep ms=N"                      (pause between records)
 * entries= encodes the engine's payload layout: for each ';'-separated entry
 * with positions, a u64 little-endian length and its sparse encoding
 * (gpu/codec.h) with box_size `box` (default: large enough for any position
 * given, so out-of-range positions can be forged; an empty entry adds
 * nothing, as a zero count does); chunk=Z then frames it as the sources do.
 * xxh3 defaults to the data's.
 *
 * Job records go as a peer holding the token sends them (peer protocol
 * 5): token=T is not sent, the record carries its MAC under the key of
 * (job, T) instead; token= empty sends neither (a host without the key);
 * auth=off sends the token in clear and no MAC (a job with auth off).
 * Every record received is printed as one line
 *   recv TYPE from NODE job=.. [version=..] [reason=..]
 * and at the end
 *   forge: sent=N recv=M refused=K
 * Exit status 0 when every record was sent (and --expect records came).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include <xxhash.h>
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/route_ucx.h"
#include "gpu/codec.h"
#include "proto/peer.pb-c.h"
#include "proto/peer_auth.h"

#define MAXF 32

struct kv {
	char *k[MAXF], *v[MAXF];
	int n;
};

static uv_loop_t loop;
static struct droute_ucx *router;
static const char *to;
static unsigned recv_n, refused_n, expect;
static int closed;

static const char *get(const struct kv *f, const char *k, const char *def)
{
	for (int i = 0; i < f->n; i++)
		if (!strcmp(f->k[i], k))
			return f->v[i];
	return def;
}

static uint64_t getu(const struct kv *f, const char *k, uint64_t def)
{
	const char *v = get(f, k, NULL);

	return v ? strtoull(v, NULL, 0) : def;
}

/* "1,2,3" into a malloc'ed array. */
static uint64_t *list_u64(const char *s, size_t *n)
{
	uint64_t *a;
	size_t cap = 1;
	char *end;

	*n = 0;
	if (!s || !*s)
		return NULL;
	for (const char *p = s; *p; p++)
		cap += *p == ',';
	a = calloc(cap, sizeof(*a));
	if (!a)
		return NULL;
	while (*s && *n < cap) {
		a[(*n)++] = strtoull(s, &end, 0);
		s = *end == ',' ? end + 1 : end + strlen(end);
	}
	return a;
}

static void on_recv(void *arg, const char *from, unsigned type, const uint8_t *msg,
		    size_t msglen, const void *data, size_t len)
{
	recv_n++;
	printf("recv %s from %s", droute_ucx_type_name(type), from);
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED) {
		Dtep__Refused *m = dtep__refused__unpack(NULL, msglen, msg);

		refused_n++;
		if (m) {
			printf(" job=%s type=%s reason=%s", m->job, droute_ucx_type_name(m->type),
			       m->reason);
			dtep__refused__free_unpacked(m, NULL);
		}
	} else if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED) {
		Dtep__Applied *m = dtep__applied__unpack(NULL, msglen, msg);

		if (m) {
			printf(" job=%s version=%llu result=%d message=%s", m->job ? m->job->job : "",
			       (unsigned long long)m->version, (int)m->result, m->message);
			dtep__applied__free_unpacked(m, NULL);
		}
	} else if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED) {
		Dtep__Staged *m = dtep__staged__unpack(NULL, msglen, msg);

		if (m) {
			printf(" job=%s version=%llu", m->job ? m->job->job : "",
			       (unsigned long long)m->version);
			dtep__staged__free_unpacked(m, NULL);
		}
	}
	printf(" bytes=%zu\n", msglen + len);
	fflush(stdout);
	if (expect && recv_n >= expect)
		uv_stop(&loop);
}

static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)n + 1)) && fread(b, 1, (size_t)n, f) == (size_t)n)
		*len = (size_t)n;
	else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

/* The payload data: a file, or sparse entries encoded here, then
 * optionally chunked, truncated, corrupted. */
static uint8_t *payload_data(const struct kv *f, size_t *len, char *err, size_t errlen)
{
	const char *file = get(f, "data", NULL), *ents = get(f, "entries", NULL);
	uint16_t value = (uint16_t)getu(f, "value", 0x3f80);
	uint8_t *out = NULL;
	size_t used = 0;

	*len = 0;
	if (file) {
		out = read_file(file[0] == '@' ? file + 1 : file, &used);
		if (!out) {
			snprintf(err, errlen, "cannot read %s", file);
			return NULL;
		}
	} else if (ents) {
		char *copy = strdup(ents), *save = NULL, *e;

		for (e = strtok_r(copy, ";", &save); e; e = strtok_r(NULL, ";", &save)) {
			size_t n, cap, got;
			uint64_t le;
			uint64_t *pos = list_u64(e, &n), box = getu(f, "box", 0), maxp = 0;
			uint16_t *val = calloc(n ? n : 1, sizeof(*val));
			uint8_t *grown;

			for (size_t i = 0; i < n; i++) {
				val[i] = value;
				maxp = pos[i] > maxp ? pos[i] : maxp;
			}
			if (!n) {
				free(pos);
				free(val);
				continue;
			}
			if (!box)
				box = maxp + 1;
			cap = dtc_sparse_bound(n);
			grown = realloc(out, used + 8 + cap);
			if (!grown || dtc_sparse_encode(pos, val, n, box, grown + used + 8, cap, &got) < 0) {
				snprintf(err, errlen, "cannot encode entry '%s' (sorted, < box?)", e);
				free(grown ? grown : out);
				free(pos);
				free(val);
				free(copy);
				return NULL;
			}
			out = grown;
			le = got;    /* little-endian hosts only, as the daemon */
			memcpy(out + used, &le, 8);
			used += 8 + got;
			free(pos);
			free(val);
		}
		free(copy);
	}
	if (get(f, "chunk", NULL)) {
		size_t cap = dtc_chunk_bound(used), got;
		uint8_t *c = malloc(cap);

		if (!c || dtc_chunk_pack(out, used, (int)getu(f, "chunk", 0), c, cap, &got) < 0) {
			snprintf(err, errlen, "chunk framing failed");
			free(c);
			free(out);
			return NULL;
		}
		free(out);
		out = c;
		used = got;
	}
	if (get(f, "truncate", NULL) && getu(f, "truncate", 0) < used)
		used = getu(f, "truncate", 0);
	if (get(f, "corrupt", NULL) && getu(f, "corrupt", 0) < used)
		out[getu(f, "corrupt", 0)] ^= 0x5a;
	*len = used;
	return out;
}

/* Pack a job record as a peer holding the token would (peer protocol 5,
 * proto/peer_auth.h): its MAC under the key of (job, token), the token
 * not on the wire.  token= empty: no MAC (a host without the key); auth=off:
 * the token in clear and no MAC (what a job with auth off sends). */
static uint8_t *pack(unsigned type, ProtobufCMessage *msg, const struct kv *f, const void *data,
		     size_t dlen, size_t *plen)
{
	Dtep__JobRef *ref = peer_auth_ref(msg);
	uint8_t key[PEER_AUTH_KEYBYTES], mac[PEER_AUTH_MACBYTES], *out;
	const char *token = get(f, "token", "");

	if (ref && *token && strcmp(get(f, "auth", "on"), "off")) {
		ref->token = (char *)protobuf_c_empty_string;
		peer_auth_key(key, ref->job, token);
		if (peer_auth_seal(key, type, msg, data, dlen, mac) < 0)
			return NULL;
	}
	*plen = protobuf_c_message_get_packed_size(msg);
	out = malloc(*plen + 1);
	if (out)
		protobuf_c_message_pack(msg, out);
	return out;
}

/* Entries of the last COUNTS sent: a PAYLOAD's part covers them by default. */
static uint32_t last_counts;

static int send_record(const char *type, struct kv *f, char *err, size_t errlen)
{
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	uint8_t *packed = NULL, *data = NULL;
	size_t plen = 0, dlen = 0;
	unsigned t;
	int rc;

	ref.job = (char *)get(f, "job", "");
	ref.token = (char *)get(f, "token", "");
	if (!strcmp(type, "encode")) {
		FILE *fo;

		data = payload_data(f, &dlen, err, errlen);
		fo = fopen(get(f, "out", ""), "wb");
		rc = data && fo && fwrite(data, 1, dlen, fo) == dlen ? 0 : -EIO;
		if (fo && fclose(fo) != 0)
			rc = -EIO;
		if (rc < 0 && !err[0])
			snprintf(err, errlen, "cannot write out=%s", get(f, "out", ""));
		else if (!rc)
			printf("encoded bytes=%zu\n", dlen);
		free(data);
		return rc;
	}
	if (!strcmp(type, "counts")) {
		Dtep__Counts m = DTEP__COUNTS__INIT;
		Dtep__Checksum cs[MAXF], *csp[MAXF];
		const char *c = get(f, "checksums", NULL);

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS;
		m.job = &ref;
		m.epoch = getu(f, "epoch", 0);
		m.version = getu(f, "version", 0);
		m.base_version = getu(f, "base", 0);
		m.mode = !strcmp(get(f, "mode", "sparse"), "dense") ? DTEP__MODE__MODE_DENSE :
								     DTEP__MODE__MODE_SPARSE;
		m.src = getu(f, "src", 0);
		m.dst = getu(f, "dst", 0);
		m.counts = list_u64(get(f, "counts", NULL), &m.n_counts);
		m.payload_bytes = getu(f, "payload_bytes", 0);
		m.parts = (uint32_t)getu(f, "parts", m.payload_bytes ? 1 : 0);
		last_counts = (uint32_t)m.n_counts;
		while (c && *c && m.n_checksums < MAXF) {
			char *end;

			dtep__checksum__init(&cs[m.n_checksums]);
			cs[m.n_checksums].dst_buffer = (uint32_t)strtoul(c, &end, 0);
			cs[m.n_checksums].partial = *end == ':' ? strtoull(end + 1, &end, 0) : 0;
			csp[m.n_checksums] = &cs[m.n_checksums];
			m.n_checksums++;
			c = *end == ',' ? end + 1 : end + strlen(end);
		}
		m.checksums = csp;
		packed = pack(t, &m.base, f, data, dlen, &plen);
		free(m.counts);
	} else if (!strcmp(type, "payload")) {
		Dtep__Payload m = DTEP__PAYLOAD__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD;
		data = payload_data(f, &dlen, err, errlen);
		if (!data && (get(f, "data", NULL) || get(f, "entries", NULL)))
			return -EINVAL;
		m.job = &ref;
		m.epoch = getu(f, "epoch", 0);
		m.version = getu(f, "version", 0);
		m.src = getu(f, "src", 0);
		m.dst = getu(f, "dst", 0);
		m.encoding = (uint32_t)getu(f, "encoding", 0);
		m.xxh3 = get(f, "xxh3", NULL) ? getu(f, "xxh3", 0) : XXH3_64bits(data, dlen);
		m.part = (uint32_t)getu(f, "part", 0);
		m.first_entry = (uint32_t)getu(f, "first_entry", 0);
		m.entries = (uint32_t)getu(f, "part_entries", last_counts - m.first_entry);
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "join")) {
		Dtep__Join m = DTEP__JOIN__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN;
		m.job = &ref;
		m.spec_hash = getu(f, "spec_hash", 0);
		m.peer_proto = (uint32_t)getu(f, "peer_proto", PEER_PROTO_VERSION);
		m.node = (char *)get(f, "node", "");
		m.address = (char *)get(f, "address", "");
		m.join_boot = getu(f, "join_boot", 0);
		m.join_seq = getu(f, "join_seq", 0);
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "leave")) {
		Dtep__Leave m = DTEP__LEAVE__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE;
		m.job = &ref;
		m.node = (char *)get(f, "node", "");
		m.participants = list_u64(get(f, "participants", NULL), &m.n_participants);
		packed = pack(t, &m.base, f, data, dlen, &plen);
		free(m.participants);
	} else if (!strcmp(type, "plan")) {
		Dtep__Plan m = DTEP__PLAN__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN;
		m.job = &ref;
		m.epoch = getu(f, "epoch", 0);
		m.peer_proto = (uint32_t)getu(f, "peer_proto", PEER_PROTO_VERSION);
		m.join_seq = getu(f, "join_seq", 0);
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "staged")) {
		Dtep__Staged m = DTEP__STAGED__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED;
		m.job = &ref;
		m.version = getu(f, "version", 0);
		m.src = getu(f, "src", 0);
		m.dst = getu(f, "dst", 0);
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "applied")) {
		Dtep__Applied m = DTEP__APPLIED__INIT;

		t = DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED;
		m.job = &ref;
		m.version = getu(f, "version", 0);
		m.dst = getu(f, "dst", 0);
		m.result = (Dtep__ApplyResult)getu(f, "result", 0);
		m.message = (char *)get(f, "message", "");
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "refused")) {
		Dtep__Refused m = DTEP__REFUSED__INIT;
		uint8_t key[PEER_AUTH_KEYBYTES], mac[PEER_AUTH_MACBYTES];

		/* Sealed as a daemon holding (job, token) seals it; token=
		 * empty: no MAC. */
		t = DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED;
		m.job = ref.job;
		m.type = (Dtep__PeerMsgType)getu(f, "type", DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN);
		m.reason = (char *)get(f, "reason", "");
		if (*ref.token) {
			peer_auth_key(key, ref.job, ref.token);
			if (peer_auth_mac(key, t, &m.base, NULL, 0, mac) < 0) {
				snprintf(err, errlen, "refused: cannot seal");
				return -ENOMEM;
			}
			m.mac.data = mac;
			m.mac.len = sizeof(mac);
		}
		packed = pack(t, &m.base, f, data, dlen, &plen);
	} else if (!strcmp(type, "raw")) {
		const char *hex = get(f, "hex", "");

		t = (unsigned)getu(f, "type", 0);
		plen = strlen(hex) / 2;
		packed = malloc(plen + 1);
		for (size_t i = 0; i < plen; i++) {
			int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

			if (hi < 0 || lo < 0) {
				snprintf(err, errlen, "hex: not a hex string");
				free(packed);
				return -EINVAL;
			}
			packed[i] = (uint8_t)(hi << 4 | lo);
		}
	} else {
		snprintf(err, errlen, "unknown record type '%s'", type);
		return -EINVAL;
	}
	if (!packed) {
		free(data);
		return -ENOMEM;
	}
	rc = droute_ucx_send_packed(router, NULL, to, t, packed, plen, data, dlen);
	if (rc < 0)
		snprintf(err, errlen, "send: %s", strerror(-rc));
	else
		printf("sent %s bytes=%zu\n", droute_ucx_type_name(t), plen + dlen);
	free(packed);
	free(data);
	return rc;
}

static void on_timeout(uv_timer_t *t)
{
	uv_stop(&loop);
}

static void on_closed(void *arg)
{
	closed = 1;
}

/* Turn the loop for ms milliseconds (or until --expect is met). */
static void run_for(unsigned ms)
{
	uv_timer_t t;

	uv_timer_init(&loop, &t);
	uv_timer_start(&t, on_timeout, ms, 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(&loop, UV_RUN_NOWAIT);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: dte-peer-forge --to HOST:PORT [--node NAME] [--wait-ms MS] "
		   "[--expect N] RECORD...\n(see the comment at the top of "
		   "tests/forge/dte_peer_forge.c for RECORD)\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "to", required_argument, NULL, 't' },
		{ "node", required_argument, NULL, 'n' },
		{ "wait-ms", required_argument, NULL, 'w' },
		{ "expect", required_argument, NULL, 'e' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct droute_ucx_params p = { .node = "forge", .recv = on_recv };
	unsigned wait_ms = 2000;
	int c, sent = 0, failed = 0;

	while ((c = getopt_long(argc, argv, "t:n:w:e:h", longopts, NULL)) != -1) {
		switch (c) {
		case 't': to = optarg; break;
		case 'n': p.node = optarg; break;
		case 'w': wait_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'e': expect = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!to || optind >= argc) {
		usage(stderr);
		return 2;
	}
	dlog_init(getenv("FORGE_DEBUG") ? DLOG_DEBUG : DLOG_WARN);
	uv_loop_init(&loop);
	if (droute_ucx_init(&router, &loop, &p) < 0) {
		fprintf(stderr, "dte-peer-forge: cannot start UCX\n");
		return 1;
	}
	for (int i = optind; i < argc; i++) {
		char *spec = strdup(argv[i]), *save = NULL, *tok, *type;
		struct kv f = { .n = 0 };
		char err[256] = "";

		type = strtok_r(spec, " ", &save);
		while ((tok = strtok_r(NULL, " ", &save)) && f.n < MAXF) {
			char *eq = strchr(tok, '=');

			if (!eq)
				continue;
			*eq = '\0';
			f.k[f.n] = tok;
			f.v[f.n++] = eq + 1;
		}
		if (type && !strcmp(type, "sleep")) {
			run_for((unsigned)getu(&f, "ms", 100));
		} else if (!type || send_record(type, &f, err, sizeof(err)) < 0) {
			fprintf(stderr, "dte-peer-forge: record %d: %s\n", i - optind + 1,
				err[0] ? err : "empty");
			failed++;
		} else {
			sent++;
		}
		free(spec);
	}
	if (!expect || recv_n < expect)
		run_for(wait_ms);
	printf("forge: sent=%d recv=%u refused=%u\n", sent, recv_n, refused_n);
	droute_ucx_close(router, on_closed, NULL);
	while (!closed)
		uv_run(&loop, UV_RUN_ONCE);
	uv_run(&loop, UV_RUN_NOWAIT);
	uv_loop_close(&loop);
	dlog_fini();
	return failed || (expect && recv_n < expect) ? 1 : 0;
}
