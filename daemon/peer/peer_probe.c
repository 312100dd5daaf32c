/* dte-peer-probe — check the peer transport between two nodes.
 *
 *   dte-peer-probe serve   --addr A [--port P] [--portfile F] [--downs N]
 *   dte-peer-probe connect --addr A --port P [--small N] [--large-mb M]
 *                          [--large-count K] [--hold]
 *
 * The server echoes small messages and acknowledges large ones, which it
 * receives into one staging buffer registered with UCX up front (as the
 * daemon's staging buffers will be); both sides check every byte.  The
 * server exits after N peers went down and prints
 *   peer: messages=.. bytes=.. rndv=.. down_detected=yes|no
 * The client prints its large-message throughput and, with --hold, "ready"
 * and then waits to be killed (to test failure detection).
 */
#include "daemon/peer/peer.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MSG_SMALL 1
#define MSG_LARGE 2
#define MSG_ACK   3

struct probe_hdr {
	uint32_t seq;
	uint32_t ok;
};

static struct {
	const char *addr, *portfile;
	unsigned port, small, large_mb, large_count, downs;
	int hold;
} opt = { .small = 1000, .large_mb = 64, .large_count = 4, .downs = 1 };

static uv_loop_t loop;
static dte_peer_ctx_t ctx;
static uv_signal_t sigterm;
static uint8_t *staging, *large_src;
static size_t large_len;
static unsigned small_done, large_acked, large_sent, downs_seen;
static int bad, exit_code;
static double t0;
static uint8_t small_src[256];

static uint8_t pattern(uint32_t seq, size_t i)
{
	return (uint8_t)(seq * 131u + i * 7u + (i >> 9));
}

static void fill(uint8_t *p, size_t len, uint32_t seq)
{
	size_t i;

	for (i = 0; i < len; i++)
		p[i] = pattern(seq, i);
}

static int check(const uint8_t *p, size_t len, uint32_t seq)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i] != pattern(seq, i))
			return 0;
	return 1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void closed_cb(dte_peer_ctx_t *c)
{
	uv_close((uv_handle_t *)&sigterm, NULL);
}

static void finish(void)
{
	if (!ctx.closing)
		dte_peer_ctx_close(&ctx, closed_cb);
}

static void on_sigterm(uv_signal_t *s, int signum)
{
	exit_code = exit_code ? exit_code : 1;
	finish();
}

static void free_cb(dte_peer_t *peer, int status, void *arg)
{
	if (status < 0)
		bad++;
	free(arg);
}

/* --- server --- */

static void srv_small(dte_peer_t *peer, unsigned id, const void *hdr,
                      size_t hlen, void *data, size_t len, void *arg)
{
	struct probe_hdr h;
	struct iovec iov;

	if (hlen != sizeof(h)) {
		bad++;
		return;
	}
	memcpy(&h, hdr, sizeof(h));
	if (!check(data, len, h.seq))
		bad++;
	iov.iov_len = len;
	iov.iov_base = malloc(len ? len : 1);
	if (!iov.iov_base) {
		bad++;
		return;
	}
	memcpy(iov.iov_base, data, len);
	if (dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), &iov, 1, free_cb,
	                  iov.iov_base) < 0) {
		free(iov.iov_base);
		bad++;
	}
}

static void *srv_alloc(dte_peer_t *peer, unsigned id, const void *hdr,
                       size_t hlen, size_t len, void *arg)
{
	return len <= large_len ? staging : NULL;
}

static void srv_large(dte_peer_t *peer, unsigned id, const void *hdr,
                      size_t hlen, void *data, size_t len, void *arg)
{
	struct probe_hdr h;

	if (hlen != sizeof(h)) {
		bad++;
		return;
	}
	memcpy(&h, hdr, sizeof(h));
	h.ok = data == staging && check(data, len, 9000 + h.seq);
	if (!h.ok)
		bad++;
	if (dte_peer_send(peer, MSG_ACK, &h, sizeof(h), NULL, 0, NULL, NULL) < 0)
		bad++;
}

static void srv_down(dte_peer_ctx_t *c, dte_peer_t *peer, int status,
                     const char *reason)
{
	printf("peer-down: name=%s id=%llu status=%d reason=\"%s\"\n",
	       dte_peer_name(peer), (unsigned long long)dte_peer_id(peer),
	       status, reason);
	fflush(stdout);
	if (++downs_seen >= opt.downs)
		finish();
}

static int run_server(void)
{
	dte_peer_mem_t *mem;
	dte_peer_stats_t st;
	uint16_t port;
	FILE *f;
	int rc;

	large_len = (size_t)opt.large_mb << 20;
	staging = malloc(large_len ? large_len : 1);
	if (!staging)
		return 1;
	if ((rc = dte_peer_mem_map(&ctx, staging, large_len ? large_len : 1,
	                           &mem)) < 0 ||
	    (rc = dte_peer_handler_set(&ctx, MSG_SMALL, srv_small, NULL,
	                               NULL)) < 0 ||
	    (rc = dte_peer_handler_set(&ctx, MSG_LARGE, srv_large, srv_alloc,
	                               NULL)) < 0 ||
	    (rc = dte_peer_listen(&ctx, opt.addr, (uint16_t)opt.port,
	                          &port)) < 0) {
		fprintf(stderr, "dte-peer-probe: serve: %s\n", strerror(-rc));
		return 1;
	}
	if (opt.portfile) {
		char tmp[4096];

		snprintf(tmp, sizeof(tmp), "%s.tmp", opt.portfile);
		f = fopen(tmp, "w");
		if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 ||
		    rename(tmp, opt.portfile) != 0) {
			perror(opt.portfile);
			return 1;
		}
	}
	printf("listening port=%u\n", port);
	fflush(stdout);
	uv_run(&loop, UV_RUN_DEFAULT);
	dte_peer_ctx_stats(&ctx, &st);
	printf("peer: messages=%llu bytes=%llu rndv=%llu staged=%llu bad=%d "
	       "down_detected=%s\n",
	       (unsigned long long)st.msgs_recv,
	       (unsigned long long)st.bytes_recv,
	       (unsigned long long)st.rndv_recv,
	       (unsigned long long)st.staged_recv, bad,
	       downs_seen >= opt.downs ? "yes" : "no");
	free(staging);
	return bad || downs_seen < opt.downs;
}

/* --- client --- */

static void cli_send_large(dte_peer_t *peer)
{
	struct probe_hdr h = { large_sent, 0 };
	struct iovec iov = { large_src, large_len };

	/* One at a time: the server has one staging slot. */
	fill(large_src, large_len, 9000 + large_sent);
	if (dte_peer_send(peer, MSG_LARGE, &h, sizeof(h), &iov, 1, NULL,
	                  NULL) < 0) {
		bad++;
		finish();
		return;
	}
	large_sent++;
}

static void cli_phase_done(dte_peer_t *peer)
{
	double mbs = 0;

	if (opt.large_count && large_acked < opt.large_count)
		return;
	if (opt.large_count)
		mbs = opt.large_count * (double)large_len / 1e6 / (now_s() - t0);
	printf("peer-probe: small=%u echoed=%u large=%ux%uMiB MB/s=%.0f bad=%d\n",
	       opt.small, small_done, large_acked, opt.large_mb, mbs, bad);
	if (opt.hold) {
		printf("ready\n");
		fflush(stdout);
		return;
	}
	fflush(stdout);
	dte_peer_close(peer);
}

static void cli_small(dte_peer_t *peer, unsigned id, const void *hdr,
                      size_t hlen, void *data, size_t len, void *arg)
{
	struct probe_hdr h;

	memcpy(&h, hdr, hlen == sizeof(h) ? sizeof(h) : 0);
	if (hlen != sizeof(h) || len != h.seq % 200 || !check(data, len, h.seq))
		bad++;
	if (++small_done < opt.small)
		return;
	t0 = now_s();
	if (opt.large_count)
		cli_send_large(peer);
	else
		cli_phase_done(peer);
}

static void cli_ack(dte_peer_t *peer, unsigned id, const void *hdr,
                    size_t hlen, void *data, size_t len, void *arg)
{
	struct probe_hdr h;

	memcpy(&h, hdr, hlen == sizeof(h) ? sizeof(h) : 0);
	if (hlen != sizeof(h) || !h.ok)
		bad++;
	large_acked++;
	if (large_sent < opt.large_count)
		cli_send_large(peer);
	else
		cli_phase_done(peer);
}

static void cli_up(dte_peer_ctx_t *c, dte_peer_t *peer)
{
	unsigned seq;

	fill(small_src, sizeof(small_src), 0);
	for (seq = 0; seq < opt.small; seq++) {
		struct probe_hdr h = { seq, 0 };
		struct iovec iov;

		iov.iov_len = seq % 200;
		iov.iov_base = malloc(iov.iov_len + 1);
		if (!iov.iov_base) {
			bad++;
			break;
		}
		fill(iov.iov_base, iov.iov_len, seq);
		if (dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), &iov, 1, free_cb,
		                  iov.iov_base) < 0) {
			free(iov.iov_base);
			bad++;
		}
	}
	if (opt.small == 0) {
		t0 = now_s();
		if (opt.large_count)
			cli_send_large(peer);
		else
			cli_phase_done(peer);
	}
}

static void cli_down(dte_peer_ctx_t *c, dte_peer_t *peer, int status,
                     const char *reason)
{
	if (status < 0) {
		fprintf(stderr, "dte-peer-probe: peer down: %s\n", reason);
		bad++;
	}
	finish();
}

static int run_client(void)
{
	dte_peer_t *peer;
	int rc;

	large_len = (size_t)opt.large_mb << 20;
	large_src = malloc(large_len ? large_len : 1);
	if (!large_src)
		return 1;
	if ((rc = dte_peer_handler_set(&ctx, MSG_SMALL, cli_small, NULL,
	                               NULL)) < 0 ||
	    (rc = dte_peer_handler_set(&ctx, MSG_ACK, cli_ack, NULL, NULL)) < 0 ||
	    (rc = dte_peer_connect(&ctx, opt.addr, (uint16_t)opt.port,
	                           &peer)) < 0) {
		fprintf(stderr, "dte-peer-probe: connect: %s\n", strerror(-rc));
		return 1;
	}
	uv_run(&loop, UV_RUN_DEFAULT);
	free(large_src);
	return bad != 0 || small_done < opt.small || large_acked < opt.large_count;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: dte-peer-probe serve --addr A [--port P] [--portfile F] "
	        "[--downs N] [--large-mb M]\n"
	        "       dte-peer-probe connect --addr A --port P [--small N] "
	        "[--large-mb M] [--large-count K] [--hold]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "addr", required_argument, NULL, 'a' },
		{ "port", required_argument, NULL, 'p' },
		{ "portfile", required_argument, NULL, 'f' },
		{ "downs", required_argument, NULL, 'd' },
		{ "small", required_argument, NULL, 's' },
		{ "large-mb", required_argument, NULL, 'm' },
		{ "large-count", required_argument, NULL, 'k' },
		{ "hold", no_argument, NULL, 'H' },
		{ NULL, 0, NULL, 0 },
	};
	dte_peer_params_t p = {
		.field_mask = DTE_PEER_PARAM_FIELD_NODE_NAME |
		              DTE_PEER_PARAM_FIELD_NODE_ID |
		              DTE_PEER_PARAM_FIELD_DOWN_CB |
		              DTE_PEER_PARAM_FIELD_UP_CB,
		.node_id = (uint64_t)getpid(),
	};
	char name[DTE_PEER_NAME_MAX];
	int server, c, rc;

	if (argc < 2)
		usage();
	server = strcmp(argv[1], "serve") == 0;
	if (!server && strcmp(argv[1], "connect") != 0)
		usage();
	while ((c = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
		switch (c) {
		case 'a': opt.addr = optarg; break;
		case 'p': opt.port = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'f': opt.portfile = optarg; break;
		case 'd': opt.downs = (unsigned)strtoul(optarg, NULL, 10); break;
		case 's': opt.small = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'm': opt.large_mb = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'k': opt.large_count = (unsigned)strtoul(optarg, NULL, 10);
		          break;
		case 'H': opt.hold = 1; break;
		default: usage();
		}
	}
	if (!opt.addr || opt.port > 65535 || (!server && !opt.port) ||
	    opt.large_mb > 4096)
		usage();
	snprintf(name, sizeof(name), "probe-%s-%d", server ? "srv" : "cli",
	         (int)getpid());
	p.node_name = name;
	p.down_cb = server ? srv_down : cli_down;
	p.up_cb = server ? NULL : cli_up;
	uv_loop_init(&loop);
	rc = dte_peer_ctx_init(&ctx, &loop, &p);
	if (rc < 0) {
		fprintf(stderr, "dte-peer-probe: %s\n", strerror(-rc));
		return 1;
	}
	uv_signal_init(&loop, &sigterm);
	uv_signal_start(&sigterm, on_sigterm, SIGTERM);
	uv_unref((uv_handle_t *)&sigterm);
	rc = server ? run_server() : run_client();
	if (!ctx.closing) {
		finish();
		uv_run(&loop, UV_RUN_DEFAULT);
	}
	if (uv_loop_close(&loop) != 0) {
		fprintf(stderr, "dte-peer-probe: loop not clean at exit\n");
		rc = 1;
	}
	return rc ? rc : exit_code;
}
