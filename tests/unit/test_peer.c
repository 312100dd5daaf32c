/* tests/unit/test_peer.c — the peer layer over real UCX and real sockets.
 *
 * Every scenario forks its peers before the parent touches UCX, so each
 * process has its own uv loop and UCX context, as separate daemons would.
 * Children cannot use cmocka asserts (a failed one would longjmp into the
 * child's copy of the runner), so they check with CHECK() and report
 * through their exit status.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/peer/peer.h"
#include "daemon/peer/peer_int.h"

#define N_SMALL     1000
#define N_MEDIUM    16
#define MEDIUM_LEN  (1u << 20)
#define N_LARGE     2
#define LARGE_LEN   ((size_t)64 << 20)

#define MSG_SMALL   1
#define MSG_LARGE   2
#define MSG_DONE    3
#define MSG_MEDIUM  4
#define MSG_UNKNOWN 77

#define CHECK(c) do { if (!(c)) { \
	fprintf(stderr, "[%d] CHECK failed %s:%d: %s\n", (int)getpid(), \
	        __FILE__, __LINE__, #c); _exit(3); } } while (0)

struct msg_hdr {
	uint32_t seq;
	uint32_t len;
};

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

static int check_fill(const uint8_t *p, size_t len, uint32_t seq)
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

/* --- one process's node: loop, context, watchdog --- */

struct node {
	uv_loop_t      loop;
	dte_peer_ctx_t ctx;
	uv_timer_t     watchdog;
	uv_timer_t     tick;
	int            ctx_closed;
	int            ups, downs;
	int            last_down_status;
	char           last_down_reason[128];
	dte_peer_t    *peer;
	void          *role;
};

static void node_watchdog_cb(uv_timer_t *t)
{
	fprintf(stderr, "[%d] watchdog: scenario hung\n", (int)getpid());
	_exit(4);
}

static void node_ctx_closed(dte_peer_ctx_t *ctx)
{
	struct node *n = ctx->data;

	n->ctx_closed = 1;
	uv_close((uv_handle_t *)&n->watchdog, NULL);
	if (uv_is_active((uv_handle_t *)&n->tick) ||
	    !uv_is_closing((uv_handle_t *)&n->tick))
		uv_close((uv_handle_t *)&n->tick, NULL);
}

static int node_init(struct node *n, const char *name, uint64_t id,
                     dte_peer_up_cb up, dte_peer_down_cb down)
{
	dte_peer_params_t p = {
		.field_mask = DTE_PEER_PARAM_FIELD_NODE_ID |
		              DTE_PEER_PARAM_FIELD_NODE_NAME |
		              DTE_PEER_PARAM_FIELD_UP_CB |
		              DTE_PEER_PARAM_FIELD_DOWN_CB,
		.node_id = id,
		.node_name = name,
		.up_cb = up,
		.down_cb = down,
	};
	int rc;

	memset(n, 0, sizeof(*n));
	uv_loop_init(&n->loop);
	rc = dte_peer_ctx_init(&n->ctx, &n->loop, &p);
	if (rc < 0)
		return rc;
	n->ctx.data = n;
	uv_timer_init(&n->loop, &n->watchdog);
	uv_timer_start(&n->watchdog, node_watchdog_cb, 20000, 0);
	uv_timer_init(&n->loop, &n->tick);
	return 0;
}

static int node_run_and_close_loop(struct node *n)
{
	uv_run(&n->loop, UV_RUN_DEFAULT);
	return uv_loop_close(&n->loop);
}

static void write_port(int fd, uint16_t port)
{
	CHECK(write(fd, &port, sizeof(port)) == sizeof(port));
}

static uint16_t read_port(int fd)
{
	uint16_t port = 0;

	CHECK(read(fd, &port, sizeof(port)) == sizeof(port));
	return port;
}

static int wait_child(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

static void env_defaults(void)
{
	setenv("UCX_TLS", "tcp", 0);
	setenv("UCX_NET_DEVICES", "lo", 0);
}

/* ===================== exchange: eager, rndv, staging ==================== */

struct xchg {
	int      small_recv, medium_recv, large_recv, bad_content;
	int      sends_done, send_errors, done_sent, done_recv;
	uint8_t *staging;
	dte_peer_mem_t *mem;
	uint8_t *medium_src, *large_src;
	double   t_large0, t_large1;
	int      large_done;
	uint64_t rndv_seen;
};

static struct xchg X;

static void x_send_small(dte_peer_t *peer, dte_peer_send_cb cb)
{
	static uint8_t bufs[N_SMALL][256];
	uint32_t seq;

	for (seq = 0; seq < N_SMALL; seq++) {
		struct msg_hdr h = { seq, seq % 200 };
		struct iovec iov[2];
		int n = 1;

		fill(bufs[seq], h.len, seq);
		iov[0].iov_base = bufs[seq];
		iov[0].iov_len = h.len;
		if (seq % 2 && h.len > 10) {    /* exercise the IOV datatype */
			iov[0].iov_len = 10;
			iov[1].iov_base = bufs[seq] + 10;
			iov[1].iov_len = h.len - 10;
			n = 2;
		}
		CHECK(dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), iov, n,
		                    cb, NULL) == 0);
	}
}

static void x_recv_small(dte_peer_t *peer, unsigned id, const void *hdr,
                         size_t hlen, void *data, size_t len, void *arg)
{
	struct msg_hdr h;

	if (hlen != sizeof(h)) {
		X.bad_content++;
		return;
	}
	memcpy(&h, hdr, sizeof(h));
	if (h.len != len || !check_fill(data, len, h.seq))
		X.bad_content++;
	X.small_recv++;
}

/* ---- server side (parent) ---- */

static void xs_check_done(dte_peer_t *peer);

static void xs_send_cb(dte_peer_t *peer, int status, void *arg)
{
	if (status != 0)
		X.send_errors++;
	X.sends_done++;
	xs_check_done(peer);
}

static void xs_check_done(dte_peer_t *peer)
{
	dte_peer_stats_t st;
	uint32_t ok;

	dte_peer_ctx_stats(dte_peer_ctx(peer), &st);
	if (X.done_sent || X.small_recv < N_SMALL || X.medium_recv < N_MEDIUM ||
	    X.large_recv < N_LARGE || X.sends_done < N_SMALL ||
	    st.dropped_unknown < 1)
		return;
	ok = X.bad_content == 0 && X.send_errors == 0;
	X.rndv_seen = st.rndv_recv;
	X.done_sent = 1;
	assert_int_equal(dte_peer_send(peer, MSG_DONE, &ok, sizeof(ok), NULL, 0,
	                               NULL, NULL), 0);
}

static void xs_recv_small(dte_peer_t *peer, unsigned id, const void *hdr,
                          size_t hlen, void *data, size_t len, void *arg)
{
	x_recv_small(peer, id, hdr, hlen, data, len, arg);
	xs_check_done(peer);
}

static void xs_recv_medium(dte_peer_t *peer, unsigned id, const void *hdr,
                           size_t hlen, void *data, size_t len, void *arg)
{
	struct msg_hdr h;

	memcpy(&h, hdr, sizeof(h));
	if (hlen != sizeof(h) || len != MEDIUM_LEN ||
	    !check_fill(data, len, 5000 + h.seq))
		X.bad_content++;
	X.medium_recv++;
	xs_check_done(peer);
}

static void *xs_alloc_large(dte_peer_t *peer, unsigned id, const void *hdr,
                            size_t hlen, size_t len, void *arg)
{
	struct msg_hdr h;

	if (hlen != sizeof(h) || len != LARGE_LEN)
		return NULL;
	memcpy(&h, hdr, sizeof(h));
	if (h.seq >= N_LARGE)
		return NULL;
	return X.staging + (size_t)h.seq * LARGE_LEN;
}

static void xs_recv_large(dte_peer_t *peer, unsigned id, const void *hdr,
                          size_t hlen, void *data, size_t len, void *arg)
{
	struct msg_hdr h;

	memcpy(&h, hdr, sizeof(h));
	if (h.seq >= N_LARGE || len != LARGE_LEN ||
	    data != X.staging + (size_t)h.seq * LARGE_LEN ||
	    !check_fill(data, len, 9000 + h.seq))
		X.bad_content++;
	X.large_recv++;
	xs_check_done(peer);
}

static void xs_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct node *n = ctx->data;

	n->ups++;
	n->peer = peer;
	assert_string_equal(dte_peer_name(peer), "client");
	assert_int_equal(dte_peer_id(peer), 2);
	x_send_small(peer, xs_send_cb);
}

static void xs_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                    const char *reason)
{
	struct node *n = ctx->data;

	n->downs++;
	snprintf(n->last_down_reason, sizeof(n->last_down_reason), "%s", reason);
	dte_peer_ctx_close(ctx, node_ctx_closed);
}

/* ---- client side (child) ---- */

static void xc_maybe_finish(dte_peer_t *peer)
{
	if (X.done_recv && X.small_recv == N_SMALL &&
	    X.sends_done == N_SMALL + N_MEDIUM + N_LARGE + 1)
		CHECK(dte_peer_close(peer) == 0);
}

static void xc_send_cb(dte_peer_t *peer, int status, void *arg)
{
	CHECK(status == 0);
	X.sends_done++;
	if (arg == &X.large_done && ++X.large_done == N_LARGE)
		X.t_large1 = now_s();
	xc_maybe_finish(peer);
}

static void xc_recv_small(dte_peer_t *peer, unsigned id, const void *hdr,
                          size_t hlen, void *data, size_t len, void *arg)
{
	x_recv_small(peer, id, hdr, hlen, data, len, arg);
	xc_maybe_finish(peer);
}

static void xc_recv_done(dte_peer_t *peer, unsigned id, const void *hdr,
                         size_t hlen, void *data, size_t len, void *arg)
{
	uint32_t ok;

	CHECK(hlen == sizeof(ok));
	memcpy(&ok, hdr, sizeof(ok));
	CHECK(ok == 1);
	X.done_recv = 1;
	xc_maybe_finish(peer);
}

static void xc_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct node *n = ctx->data;
	struct msg_hdr h = { 0, 0 };
	uint32_t i;

	CHECK(peer == n->peer);
	CHECK(strcmp(dte_peer_name(peer), "server") == 0);
	CHECK(dte_peer_id(peer) == 1);
	n->ups++;
	/* Unknown id first: the server must count it and keep going. */
	CHECK(dte_peer_send(peer, MSG_UNKNOWN, &h, sizeof(h), NULL, 0,
	                    xc_send_cb, NULL) == 0);
	x_send_small(peer, xc_send_cb);
	for (i = 0; i < N_MEDIUM; i++) {
		struct iovec iov = { X.medium_src + (size_t)i * MEDIUM_LEN,
		                     MEDIUM_LEN };

		h.seq = i;
		h.len = MEDIUM_LEN;
		CHECK(dte_peer_send(peer, MSG_MEDIUM, &h, sizeof(h), &iov, 1,
		                    xc_send_cb, NULL) == 0);
	}
	X.t_large0 = now_s();
	for (i = 0; i < N_LARGE; i++) {
		struct iovec iov = { X.large_src + (size_t)i * LARGE_LEN,
		                     LARGE_LEN };

		h.seq = i;
		h.len = 0;
		CHECK(dte_peer_send(peer, MSG_LARGE, &h, sizeof(h), &iov, 1,
		                    xc_send_cb, &X.large_done) == 0);
	}
}

static void xc_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                    const char *reason)
{
	struct node *n = ctx->data;

	CHECK(status == 0);   /* we closed it */
	n->downs++;
	CHECK(dte_peer_ctx_close(ctx, node_ctx_closed) == 0);
}

static void xchg_client(int port_fd)
{
	struct node n;
	uint16_t port = read_port(port_fd);
	uint32_t i;

	memset(&X, 0, sizeof(X));
	X.medium_src = malloc((size_t)N_MEDIUM * MEDIUM_LEN);
	X.large_src = malloc((size_t)N_LARGE * LARGE_LEN);
	CHECK(X.medium_src && X.large_src);
	for (i = 0; i < N_MEDIUM; i++)
		fill(X.medium_src + (size_t)i * MEDIUM_LEN, MEDIUM_LEN, 5000 + i);
	for (i = 0; i < N_LARGE; i++)
		fill(X.large_src + (size_t)i * LARGE_LEN, LARGE_LEN, 9000 + i);
	CHECK(node_init(&n, "client", 2, xc_up, xc_down) == 0);
	CHECK(dte_peer_handler_set(&n.ctx, MSG_SMALL, xc_recv_small, NULL,
	                           NULL) == 0);
	CHECK(dte_peer_handler_set(&n.ctx, MSG_DONE, xc_recv_done, NULL,
	                           NULL) == 0);
	CHECK(dte_peer_connect(&n.ctx, "127.0.0.1", port, &n.peer) == 0);
	CHECK(node_run_and_close_loop(&n) == 0);
	CHECK(n.ctx_closed && n.ups == 1 && n.downs == 1);
	CHECK(X.bad_content == 0 && X.small_recv == N_SMALL);
	printf("peer-loopback: large=%dx%zuMiB MB/s=%.0f\n", N_LARGE,
	       LARGE_LEN >> 20,
	       N_LARGE * (double)LARGE_LEN / 1e6 / (X.t_large1 - X.t_large0));
	free(X.medium_src);
	free(X.large_src);
	fflush(stdout);
	fflush(stdout);
	exit(0);   /* not _exit: let LeakSanitizer check the child */
}

static void test_exchange(void **state)
{
	struct node n;
	dte_peer_stats_t st;
	uint16_t port = 0;
	int fds[2];
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[1]);
		xchg_client(fds[0]);
	}
	close(fds[0]);

	memset(&X, 0, sizeof(X));
	X.staging = malloc((size_t)N_LARGE * LARGE_LEN);
	assert_non_null(X.staging);
	assert_int_equal(node_init(&n, "server", 1, xs_up, xs_down), 0);
	assert_int_equal(dte_peer_mem_map(&n.ctx, X.staging,
	                                  (size_t)N_LARGE * LARGE_LEN, &X.mem), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, MSG_SMALL, xs_recv_small,
	                                      NULL, NULL), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, MSG_MEDIUM,
	                                      xs_recv_medium, NULL, NULL), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, MSG_LARGE, xs_recv_large,
	                                      xs_alloc_large, NULL), 0);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &port), 0);
	assert_true(port > 0);
	write_port(fds[1], port);
	close(fds[1]);

	assert_int_equal(node_run_and_close_loop(&n), 0);
	assert_int_equal(wait_child(pid), 0);
	st = n.ctx.stats;
	assert_true(n.ctx_closed);
	assert_int_equal(n.ups, 1);
	assert_int_equal(n.downs, 1);
	assert_int_equal(X.bad_content, 0);
	assert_int_equal(X.small_recv, N_SMALL);
	assert_int_equal(X.medium_recv, N_MEDIUM);
	assert_int_equal(X.large_recv, N_LARGE);
	assert_int_equal(X.send_errors, 0);
	assert_int_equal(st.dropped_unknown, 1);
	assert_int_equal(st.dropped_bad, 0);
	assert_int_equal(st.msgs_recv, N_SMALL + N_MEDIUM + N_LARGE);
	assert_true(X.rndv_seen >= N_LARGE);
	assert_true(st.staged_recv >= N_LARGE);
	printf("peer-loopback: messages=%llu bytes=%llu rndv=%llu staged=%llu "
	       "dropped_unknown=%llu down_reason=\"%s\"\n",
	       (unsigned long long)st.msgs_recv,
	       (unsigned long long)st.bytes_recv,
	       (unsigned long long)st.rndv_recv,
	       (unsigned long long)st.staged_recv,
	       (unsigned long long)st.dropped_unknown, n.last_down_reason);
	free(X.staging);
}

/* ============= SIGKILLed peer detected; a third peer still served ========= */

#define N_ECHO 100

struct killst {
	pid_t  victim;
	double t_kill, t_down;
	int    victim_down, victim_status;
	int    survivor_recv, survivor_down;
	int    go_fd;
	uint16_t port;
	int    bad;
};

static struct killst K;

static void free_on_send(dte_peer_t *peer, int status, void *arg)
{
	free(arg);
}

static void ks_recv(dte_peer_t *peer, unsigned id, const void *hdr,
                    size_t hlen, void *data, size_t len, void *arg)
{
	struct msg_hdr h;
	struct iovec iov = { data, len };

	memcpy(&h, hdr, sizeof(h));
	if (strcmp(dte_peer_name(peer), "victim") == 0) {
		K.t_kill = now_s();
		assert_int_equal(kill(K.victim, SIGKILL), 0);
		return;
	}
	if (hlen != sizeof(h) || h.len != len || !check_fill(data, len, h.seq))
		K.bad++;
	K.survivor_recv++;
	/* data is only valid during this call: echo from a copy that the
	 * send completion frees. */
	iov.iov_base = malloc(len ? len : 1);
	assert_non_null(iov.iov_base);
	memcpy(iov.iov_base, data, len);
	assert_int_equal(dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), &iov, 1,
	                               free_on_send, iov.iov_base), 0);
}

static void ks_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct node *n = ctx->data;

	n->ups++;
}

static void ks_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                    const char *reason)
{
	struct node *n = ctx->data;

	n->downs++;
	if (strcmp(dte_peer_name(peer), "victim") == 0) {
		K.victim_down = 1;
		K.victim_status = status;
		K.t_down = now_s();
		printf("peer-kill: victim down after %.2fs: %s\n",
		       K.t_down - K.t_kill, reason);
		write_port(K.go_fd, K.port);
		close(K.go_fd);
		return;
	}
	K.survivor_down = 1;
	dte_peer_ctx_close(ctx, node_ctx_closed);
}

static void victim_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct msg_hdr h = { 0, 0 };

	CHECK(dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), NULL, 0, NULL,
	                    NULL) == 0);
}

static void victim_main(int port_fd)
{
	struct node n;
	uint16_t port = read_port(port_fd);

	CHECK(node_init(&n, "victim", 10, victim_up, NULL) == 0);
	CHECK(dte_peer_connect(&n.ctx, "127.0.0.1", port, &n.peer) == 0);
	uv_run(&n.loop, UV_RUN_DEFAULT);   /* until SIGKILL or watchdog */
	_exit(5);
}

static int survivor_echoes;
static uint8_t survivor_buf[N_ECHO][128];

static void sv_recv(dte_peer_t *peer, unsigned id, const void *hdr,
                    size_t hlen, void *data, size_t len, void *arg)
{
	struct msg_hdr h;

	CHECK(hlen == sizeof(h));
	memcpy(&h, hdr, sizeof(h));
	CHECK(h.len == len && check_fill(data, len, h.seq));
	if (++survivor_echoes == N_ECHO)
		CHECK(dte_peer_close(peer) == 0);
}

static void sv_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	uint32_t seq;

	for (seq = 0; seq < N_ECHO; seq++) {
		struct msg_hdr h = { seq, 1 + seq };
		struct iovec iov = { survivor_buf[seq], h.len };

		fill(survivor_buf[seq], h.len, seq);
		CHECK(dte_peer_send(peer, MSG_SMALL, &h, sizeof(h), &iov, 1,
		                    NULL, NULL) == 0);
	}
}

static void sv_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                    const char *reason)
{
	CHECK(status == 0);
	CHECK(dte_peer_ctx_close(ctx, node_ctx_closed) == 0);
}

static void survivor_main(int go_fd)
{
	struct node n;
	uint16_t port = read_port(go_fd);

	CHECK(node_init(&n, "survivor", 11, sv_up, sv_down) == 0);
	CHECK(dte_peer_handler_set(&n.ctx, MSG_SMALL, sv_recv, NULL, NULL) == 0);
	CHECK(dte_peer_connect(&n.ctx, "127.0.0.1", port, &n.peer) == 0);
	CHECK(node_run_and_close_loop(&n) == 0);
	CHECK(survivor_echoes == N_ECHO);
	fflush(stdout);
	exit(0);   /* not _exit: let LeakSanitizer check the child */
}

static void test_kill_detected(void **state)
{
	int vfd[2], sfd[2];
	pid_t survivor;
	struct node n;

	memset(&K, 0, sizeof(K));
	assert_int_equal(pipe(vfd), 0);
	assert_int_equal(pipe(sfd), 0);
	fflush(stdout);
	K.victim = fork();
	assert_true(K.victim >= 0);
	if (K.victim == 0) {
		close(sfd[0]);
		close(sfd[1]);
		close(vfd[1]);
		victim_main(vfd[0]);
	}
	fflush(stdout);
	survivor = fork();
	assert_true(survivor >= 0);
	if (survivor == 0) {
		close(vfd[0]);
		close(vfd[1]);
		close(sfd[1]);
		survivor_main(sfd[0]);
	}
	close(vfd[0]);
	close(sfd[0]);
	K.go_fd = sfd[1];

	assert_int_equal(node_init(&n, "hub", 1, ks_up, ks_down), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, MSG_SMALL, ks_recv, NULL,
	                                      NULL), 0);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &K.port), 0);
	write_port(vfd[1], K.port);
	close(vfd[1]);
	assert_int_equal(node_run_and_close_loop(&n), 0);
	assert_int_equal(wait_child(K.victim), 128 + SIGKILL);
	assert_int_equal(wait_child(survivor), 0);
	assert_true(K.victim_down);
	assert_true(K.victim_status < 0);
	assert_true(K.t_down - K.t_kill < 5.0);
	assert_int_equal(K.survivor_recv, N_ECHO);
	assert_int_equal(K.bad, 0);
	assert_true(K.survivor_down);
	assert_int_equal(n.ups, 2);
	assert_int_equal(n.downs, 2);
}

/* =================== connect to a port nobody listens on ================== */

static void refused_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct node *n = ctx->data;

	n->ups++;
}

static void refused_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                         const char *reason)
{
	struct node *n = ctx->data;

	n->downs++;
	n->last_down_status = status;
	snprintf(n->last_down_reason, sizeof(n->last_down_reason), "%s", reason);
	assert_int_equal(dte_peer_ctx_close(ctx, node_ctx_closed), 0);
}

/* A port that was free a moment ago. */
static uint16_t free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port;

	assert_true(fd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

static void test_connect_refused(void **state)
{
	struct node n;
	dte_peer_t *peer = NULL;
	double t0;

	assert_int_equal(node_init(&n, "lonely", 3, refused_up, refused_down), 0);
	t0 = now_s();
	assert_int_equal(dte_peer_connect(&n.ctx, "127.0.0.1", free_port(),
	                                  &peer), 0);
	assert_non_null(peer);
	assert_int_equal(dte_peer_is_up(peer), 0);
	/* Not up yet: user messages are refused, not queued. */
	assert_int_equal(dte_peer_send(peer, MSG_SMALL, NULL, 0, NULL, 0, NULL,
	                               NULL), -ENOTCONN);
	assert_int_equal(node_run_and_close_loop(&n), 0);
	assert_int_equal(n.ups, 0);
	assert_int_equal(n.downs, 1);
	assert_true(n.last_down_status < 0);
	assert_true(now_s() - t0 < 10.0);
	printf("peer-refused: status=%d reason=\"%s\"\n", n.last_down_status,
	       n.last_down_reason);
}

/* ============================ argument checks ============================= */

static void test_bad_args(void **state)
{
	char longname[DTE_PEER_NAME_MAX + 1];
	dte_peer_params_t p = {
		.field_mask = DTE_PEER_PARAM_FIELD_NODE_NAME,
		.node_name = longname,
	};
	static char hdr[DTE_PEER_HEADER_MAX + 1];
	dte_peer_mem_t *mem = (dte_peer_mem_t *)&p;   /* must stay untouched */
	dte_peer_t *peer = (dte_peer_t *)&p;
	struct node n;
	uv_loop_t loop;
	dte_peer_ctx_t ctx;
	uint16_t port = 7;

	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	uv_loop_init(&loop);
	assert_int_equal(dte_peer_ctx_init(&ctx, &loop, &p), -EINVAL);
	assert_int_equal(dte_peer_ctx_init(NULL, &loop, NULL), -EINVAL);
	assert_int_equal(dte_peer_ctx_init(&ctx, NULL, NULL), -EINVAL);
	assert_int_equal(uv_loop_close(&loop), 0);

	assert_int_equal(node_init(&n, "args", 4, NULL, NULL), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, DTE_PEER_MSG_ID_MAX,
	                                      x_recv_small, NULL, NULL), -EINVAL);
	assert_int_equal(dte_peer_handler_set(&n.ctx, 1, NULL, xs_alloc_large,
	                                      NULL), -EINVAL);
	assert_int_equal(dte_peer_listen(&n.ctx, "not-an-address", 0, &port),
	                 -EINVAL);
	assert_int_equal(dte_peer_listen(&n.ctx, NULL, 0, &port), -EINVAL);
	assert_int_equal(port, 7);
	assert_int_equal(dte_peer_connect(&n.ctx, "300.1.1.1", 5, &peer),
	                 -EINVAL);
	assert_int_equal(dte_peer_connect(&n.ctx, "127.0.0.1", 0, &peer),
	                 -EINVAL);
	assert_ptr_equal(peer, (dte_peer_t *)&p);
	assert_int_equal(dte_peer_mem_map(&n.ctx, NULL, 10, &mem), -EINVAL);
	assert_int_equal(dte_peer_mem_map(&n.ctx, hdr, 0, &mem), -EINVAL);
	assert_ptr_equal(mem, (dte_peer_mem_t *)&p);
	assert_int_equal(dte_peer_mem_map(&n.ctx, hdr, sizeof(hdr), &mem), 0);
	assert_int_equal(dte_peer_mem_unmap(&n.ctx, mem), 0);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &port), 0);
	assert_true(port != 7 && port != 0);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &port),
	                 -EALREADY);

	/* A connecting peer: sends are checked before the state is. */
	assert_int_equal(dte_peer_connect(&n.ctx, "127.0.0.1", port, &peer), 0);
	assert_int_equal(dte_peer_send(peer, DTE_PEER_MSG_ID_MAX, NULL, 0, NULL,
	                               0, NULL, NULL), -EINVAL);
	assert_int_equal(dte_peer_send(peer, 1, hdr, sizeof(hdr), NULL, 0, NULL,
	                               NULL), -EMSGSIZE);
	assert_int_equal(dte_peer_send(peer, 1, NULL, 4, NULL, 0, NULL, NULL),
	                 -EINVAL);
	assert_int_equal(dte_peer_send(peer, 1, NULL, 0, NULL, 1, NULL, NULL),
	                 -EINVAL);
	assert_int_equal(dte_peer_send(peer, 1, NULL, 0, NULL, -1, NULL, NULL),
	                 -EINVAL);
	assert_int_equal(dte_peer_send(NULL, 1, NULL, 0, NULL, 0, NULL, NULL),
	                 -EINVAL);
	assert_int_equal(dte_peer_close(NULL), -EINVAL);

	/* Closing with a half-open peer and no loop turn in between. */
	assert_int_equal(dte_peer_ctx_close(&n.ctx, node_ctx_closed), 0);
	assert_int_equal(dte_peer_ctx_close(&n.ctx, node_ctx_closed), -EINVAL);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &port), -EINVAL);
	assert_int_equal(node_run_and_close_loop(&n), 0);
	assert_true(n.ctx_closed);
}

/* ================= malformed frames from a misbehaving peer =============== */

static int bad_sentinel;

static void bad_recv(dte_peer_t *peer, unsigned id, const void *hdr,
                     size_t hlen, void *data, size_t len, void *arg)
{
	dte_peer_stats_t st;
	uint32_t counts[2];

	dte_peer_ctx_stats(dte_peer_ctx(peer), &st);
	bad_sentinel++;
	counts[0] = (uint32_t)st.dropped_bad;
	counts[1] = (uint32_t)st.dropped_unknown;
	assert_int_equal(dte_peer_send(peer, MSG_DONE, counts, sizeof(counts),
	                               NULL, 0, NULL, NULL), 0);
}

static void bad_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                     const char *reason)
{
	dte_peer_ctx_close(ctx, node_ctx_closed);
}

static void evil_done(dte_peer_t *peer, unsigned id, const void *hdr,
                      size_t hlen, void *data, size_t len, void *arg)
{
	uint32_t counts[2];

	CHECK(hlen == sizeof(counts));
	memcpy(counts, hdr, sizeof(counts));
	CHECK(counts[0] == 5);   /* short, long claim, magic, 2nd HELLO, huge */
	CHECK(counts[1] == 1);   /* msg id out of range */
	CHECK(dte_peer_close(peer) == 0);
}

static void evil_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct dte_peer_wire_hdr wh = { DTE_PEER_MAGIC, 1, 0 };
	struct dte_peer_hello hello = { .magic = DTE_PEER_MAGIC,
	                                .version = DTE_PEER_VERSION };
	uint8_t junk[16] = { 0 };
	static uint8_t big[2 * DTE_PEER_HEADER_MAX];

	/* Too short for the wire header. */
	CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, 3, NULL, 0, NULL, 0,
	                     NULL, NULL) == 0);
	/* Claims 10 header bytes, carries 4. */
	wh.hdr_len = 10;
	CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, sizeof(wh), junk, 4,
	                     NULL, 0, NULL, NULL) == 0);
	/* Wrong magic. */
	wh.magic = 0xdeadbeef;
	wh.hdr_len = 4;
	CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, sizeof(wh), junk, 4,
	                     NULL, 0, NULL, NULL) == 0);
	/* A second HELLO on an established peer. */
	CHECK(dte_peer__send(peer, DTE_PEER_AM_HELLO, &hello, sizeof(hello),
	                     NULL, 0, NULL, 0, NULL, NULL) == 0);
	/* A user header over the cap, if UCX lets it through at all. */
	wh.magic = DTE_PEER_MAGIC;
	wh.hdr_len = sizeof(big);
	if (sizeof(wh) + sizeof(big) <= ctx->max_am_header)
		CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, sizeof(wh), big,
		                     sizeof(big), NULL, 0, NULL, NULL) == 0);
	else
		CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, 3, NULL, 0, NULL,
		                     0, NULL, NULL) == 0);
	/* Well formed, id out of range. */
	wh.msg_id = 300;
	wh.hdr_len = 0;
	CHECK(dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, sizeof(wh), NULL, 0,
	                     NULL, 0, NULL, NULL) == 0);
	/* Sentinel. */
	CHECK(dte_peer_send(peer, MSG_SMALL, NULL, 0, NULL, 0, NULL, NULL) == 0);
}

static void evil_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status,
                      const char *reason)
{
	CHECK(status == 0);
	CHECK(dte_peer_ctx_close(ctx, node_ctx_closed) == 0);
}

static void evil_main(int port_fd)
{
	struct node n;
	uint16_t port = read_port(port_fd);

	CHECK(node_init(&n, "evil", 66, evil_up, evil_down) == 0);
	CHECK(dte_peer_handler_set(&n.ctx, MSG_DONE, evil_done, NULL, NULL) == 0);
	CHECK(dte_peer_connect(&n.ctx, "127.0.0.1", port, &n.peer) == 0);
	CHECK(node_run_and_close_loop(&n) == 0);
	fflush(stdout);
	exit(0);   /* not _exit: let LeakSanitizer check the child */
}

static void test_malformed(void **state)
{
	struct node n;
	uint16_t port;
	int fds[2];
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[1]);
		evil_main(fds[0]);
	}
	close(fds[0]);
	bad_sentinel = 0;
	assert_int_equal(node_init(&n, "victim", 1, NULL, bad_down), 0);
	assert_int_equal(dte_peer_handler_set(&n.ctx, MSG_SMALL, bad_recv, NULL,
	                                      NULL), 0);
	assert_int_equal(dte_peer_listen(&n.ctx, "127.0.0.1", 0, &port), 0);
	write_port(fds[1], port);
	close(fds[1]);
	assert_int_equal(node_run_and_close_loop(&n), 0);
	assert_int_equal(wait_child(pid), 0);
	assert_int_equal(bad_sentinel, 1);
	assert_int_equal(n.ctx.stats.dropped_bad, 5);
	assert_int_equal(n.ctx.stats.dropped_unknown, 1);
	assert_int_equal(n.ctx.stats.msgs_recv, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exchange),
		cmocka_unit_test(test_kill_detected),
		cmocka_unit_test(test_connect_refused),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_malformed),
	};

	env_defaults();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
