/* daemon/main.c — dted: option parsing, module init/fini, signals, loop.
 *
 * Modules start in one order and are unwound in exactly the reverse order;
 * the loop must close clean (no handle left) before the process exits.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/ctl.h"
#include "daemon/daemonize.h"
#include "daemon/dispatch.h"
#include "daemon/http_metrics.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/notify.h"
#include "daemon/registry.h"
#include "daemon/job.h"
#include "daemon/job_auth.h"
#include "daemon/job_persist.h"
#include "daemon/route.h"
#include "daemon/route_ucx.h"
#include "daemon/side_table.h"
#include "gpu/backend.h"

struct opts {
	const char *config;          /* NULL: DCONF_DEFAULT_PATH if it exists */
	const char *socket;
	int log_level;               /* -1: from the config */
	int foreground;
	const char *peer_listen;     /* HOST:PORT, overrides [peer] */
};

static struct opts opt = { .log_level = -1 };
static struct dconf conf;
static struct dsrv srv;
static uv_signal_t sig_term, sig_int, sig_hup;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dted [options]\n"
		"  -c, --config FILE     configuration (default %s if present)\n"
		"  -s, --socket PATH     control socket (overrides [daemon] socket)\n"
		"  -f, --foreground      do not detach (systemd, tests)\n"
		"  -l, --log-level LVL   error|warn|notice|info|debug (overrides config)\n"
		"  -p, --peer-listen HOST:PORT  peer (UCX) listener, port 0 = any (overrides [peer])\n"
		"  -h, --help            this text\n"
		"  -V, --version         print the version and exit\n",
		DCONF_DEFAULT_PATH);
}

static int parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 's' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "peer-listen", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "c:s:fl:p:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': opt.config = optarg; break;
		case 's': opt.socket = optarg; break;
		case 'f': opt.foreground = 1; break;
		case 'l':
			opt.log_level = dlog_level_parse(optarg);
			if (opt.log_level < 0) {
				fprintf(stderr, "dted: --log-level: '%s' is not one of "
					"error|warn|notice|info|debug\n", optarg);
				return 2;
			}
			break;
		case 'p': opt.peer_listen = optarg; break;
		case 'h': usage(stdout); exit(0);
		case 'V': printf("dted %s (protocol %u)\n", DTE_VERSION, DTE_PROTO_VERSION); exit(0);
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dted: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	return 0;
}

/* Defaults, then the file, then the command line. */
static int load_conf(struct dconf *c, char *err, size_t errlen)
{
	struct stat st;

	dconf_defaults(c);
	if (opt.config) {
		if (dconf_load_file(c, opt.config, err, errlen) < 0)
			return -1;
	} else if (stat(DCONF_DEFAULT_PATH, &st) == 0) {
		if (dconf_load_file(c, DCONF_DEFAULT_PATH, err, errlen) < 0)
			return -1;
	}
	if (opt.socket) {
		if (opt.socket[0] != '/' && opt.socket[0] != '.') {
			snprintf(err, errlen, "--socket: '%s' is not a path", opt.socket);
			return -1;
		}
		if (strlen(opt.socket) >= sizeof(c->socket)) {
			snprintf(err, errlen, "--socket: path longer than %zu bytes",
				 sizeof(c->socket) - 1);
			return -1;
		}
		snprintf(c->socket, sizeof(c->socket), "%s", opt.socket);
		dconf_mark_flag(c, DCONF_K_SOCKET);
	}
	if (opt.log_level >= 0) {
		c->log_level = opt.log_level;
		dconf_mark_flag(c, DCONF_K_LOG_LEVEL);
	}
	if (opt.peer_listen &&
	    dconf_parse_hostport(opt.peer_listen, c->peer_listen_address,
				 sizeof(c->peer_listen_address), &c->peer_listen_port) < 0) {
		snprintf(err, errlen, "--peer-listen: '%s' is not HOST:PORT", opt.peer_listen);
		return -1;
	}
	if (opt.peer_listen) {
		dconf_mark_flag(c, DCONF_K_PEER_LISTEN_ADDRESS);
		dconf_mark_flag(c, DCONF_K_PEER_LISTEN_PORT);
	}
	return dconf_finish(c, err, errlen);
}

/* SIGHUP: re-read the file; apply what can change while running (log
 * level, allow lists), say what needs a restart. */
static void reload(void)
{
	struct dconf nc;
	char err[512];

	dnotify_reloading();
	if (load_conf(&nc, err, sizeof(err)) < 0) {
		DLOG_E("reload failed, keeping the running configuration: %s", err);
		goto out;
	}
	dlog_set_level(nc.log_level);
	conf.log_level = nc.log_level;
	memcpy(conf.allow_uids, nc.allow_uids, sizeof(conf.allow_uids));
	conf.n_allow_uids = nc.n_allow_uids;
	memcpy(conf.allow_gids, nc.allow_gids, sizeof(conf.allow_gids));
	conf.n_allow_gids = nc.n_allow_gids;
	conf.max_staged_versions = nc.max_staged_versions;
	job_set_max_staged(srv.eng, conf.max_staged_versions);
	conf.verify_full_every = nc.verify_full_every;
	job_set_verify_full_every(srv.eng, conf.verify_full_every);
	conf.peer_part_bytes = nc.peer_part_bytes;
	job_set_part_bytes(srv.eng, (size_t)conf.peer_part_bytes);
	conf.mark_table_bytes = nc.mark_table_bytes;
	side_set_cap(conf.mark_table_bytes);
	memcpy(conf.sync_mode, nc.sync_mode, sizeof(conf.sync_mode));
	job_set_mode_policy(srv.eng, strcmp(conf.sync_mode, "sparse") ? 0 : 1);
	conf.peer_relay_fanout = nc.peer_relay_fanout;
	conf.peer_relay_roots = nc.peer_relay_roots;
	conf.peer_relay_lag_ms = nc.peer_relay_lag_ms;
	conf.peer_relay_measured = nc.peer_relay_measured;
	conf.peer_relay_rate_age_ms = nc.peer_relay_rate_age_ms;
	job_set_relay(srv.eng, conf.peer_relay_fanout, conf.peer_relay_roots,
		      conf.peer_relay_lag_ms);
	job_set_relay_shape(srv.eng, conf.peer_relay_measured, conf.peer_relay_rate_age_ms);
	if (strcmp(nc.socket, conf.socket) || strcmp(nc.runtime_dir, conf.runtime_dir) ||
	    nc.max_frame_bytes != conf.max_frame_bytes || nc.max_clients != conf.max_clients ||
	    strcmp(nc.compute_backend, conf.compute_backend) ||
	    strcmp(nc.node_name, conf.node_name) || strcmp(nc.socket_group, conf.socket_group) ||
	    strcmp(nc.peer_listen_address, conf.peer_listen_address) ||
	    nc.peer_listen_port != conf.peer_listen_port ||
	    strcmp(nc.peer_advertise_address, conf.peer_advertise_address) ||
	    nc.peer_staging_bytes != conf.peer_staging_bytes ||
	    strcmp(nc.metrics_listen, conf.metrics_listen))
		DLOG_W("reload: socket, frame cap, client cap, backend, node name, metrics_listen "
		       "and [peer] changes take effect only after a restart");
	DLOG_N("reloaded configuration; log level %s", dlog_level_name(dlog_get_level()));
out:
	dnotify_ready("serving");
	dnotify_status("serving on %s, log level %s", dctl_path(),
		       dlog_level_name(dlog_get_level()));
}

static void on_signal(uv_signal_t *h, int signum)
{
	if (signum == SIGHUP) {
		reload();
		return;
	}
	DLOG_N("%s: shutting down", strsignal(signum));
	dnotify_stopping();
	uv_stop(h->loop);
}

static int signals_init(uv_loop_t *loop)
{
	uv_signal_init(loop, &sig_term);
	uv_signal_init(loop, &sig_int);
	uv_signal_init(loop, &sig_hup);
	if (uv_signal_start(&sig_term, on_signal, SIGTERM) < 0 ||
	    uv_signal_start(&sig_int, on_signal, SIGINT) < 0 ||
	    uv_signal_start(&sig_hup, on_signal, SIGHUP) < 0)
		return -1;
	/* A client hanging up mid-reply must cost a write error, not the
	 * daemon. */
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

static void signals_fini(void)
{
	uv_close((uv_handle_t *)&sig_hup, NULL);
	uv_close((uv_handle_t *)&sig_int, NULL);
	uv_close((uv_handle_t *)&sig_term, NULL);
}

/* The peer listener's bind, retried while it fails (a port held by
 * another process, or an old socket the kernel still holds): first after
 * LISTEN_RETRY_FIRST_MS, doubling to LISTEN_RETRY_MAX_MS, forever.  The
 * failure is explained once, with the fix (listen_explain); the retries
 * are debug lines (another error than the first is said once too), and
 * `dtectl peers` (listen_error, listen_retries) and the
 * dted_peer_listener gauge show the state meanwhile, so the listener is
 * never silently absent. */
#define LISTEN_RETRY_FIRST_MS 250u
#define LISTEN_RETRY_MAX_MS   8000u

static struct {
	uv_timer_t timer;
	int timer_init;
	uint32_t backoff_ms;
	uint64_t tries;
	int said_rc;              /* the error last explained in the log */
	char error[160];
} lsn;

/* One line: which address, why, what it means and what to do. */
static void listen_explain(int rc)
{
	lsn.said_rc = rc;
	if (rc == -EADDRINUSE)
		DLOG_E("peers: cannot listen on %s:%u: another process holds that port (another "
		       "dted?), and until it is free other daemons cannot connect to this one; "
		       "use another port (--peer-listen %s:0 for any free one, or listen_port in "
		       "[peer] of dted.conf) or stop the other daemon; retrying quietly meanwhile",
		       conf.peer_listen_address, conf.peer_listen_port, conf.peer_listen_address);
	else
		DLOG_E("peers: cannot listen on %s:%u: %s, and until it can other daemons cannot "
		       "connect to this one; check --peer-listen, or listen_address and "
		       "listen_port in [peer] of dted.conf; retrying quietly meanwhile",
		       conf.peer_listen_address, conf.peer_listen_port, strerror(-rc));
}

static void listen_retry(uv_timer_t *t)
{
	struct droute_ucx *r = droute_ucx_daemon();
	int rc;

	if (!r)
		return;
	lsn.tries++;
	rc = droute_ucx_listen(r, conf.peer_listen_address, conf.peer_listen_port,
			       conf.peer_advertise_address);
	if (rc == 0 || rc == -EALREADY) {
		DLOG_N("peers: listening on %s after %llu retries", droute_ucx_address(r),
		       (unsigned long long)lsn.tries);
		route_set_self_address(droute_ucx_address(r));
		lsn.error[0] = '\0';
		droute_ucx_listen_failed(r, "", lsn.tries);
		dmetrics_set(DM_PEER_LISTENER, NULL, 1);
		return;
	}
	snprintf(lsn.error, sizeof(lsn.error), "cannot bind %s:%u: %s", conf.peer_listen_address,
		 conf.peer_listen_port, strerror(-rc));
	droute_ucx_listen_failed(r, lsn.error, lsn.tries);
	if (lsn.backoff_ms < LISTEN_RETRY_MAX_MS)
		lsn.backoff_ms *= 2;
	if (rc != lsn.said_rc)
		listen_explain(rc);
	DLOG_D("peers: listener retry %llu failed: %s; next in %u ms", (unsigned long long)lsn.tries,
	       lsn.error, lsn.backoff_ms);
	uv_timer_start(&lsn.timer, listen_retry, lsn.backoff_ms, 0);
}

/* The peer transport.  A listener that cannot bind (port taken) is an
 * error, retried (above); meanwhile the daemon still serves its clients
 * and still reaches other daemons: links it opens carry traffic both
 * ways. */
static int peers_init(uv_loop_t *loop)
{
	struct droute_ucx_params p = {
		.node = conf.node_name,
		.listen_address = conf.peer_listen_address,
		.listen_port = conf.peer_listen_port,
		.advertise = conf.peer_advertise_address,
		.staging_bytes = (size_t)conf.peer_staging_bytes,
	};
	struct droute_ucx *r;
	int rc;

	rc = droute_ucx_init(&r, loop, &p);
	if (rc < 0 && p.listen_address[0]) {
		snprintf(lsn.error, sizeof(lsn.error), "cannot bind %s:%u: %s",
			 conf.peer_listen_address, conf.peer_listen_port, strerror(-rc));
		listen_explain(rc);
		p.listen_address = NULL;
		rc = droute_ucx_init(&r, loop, &p);
		if (rc == 0)
			droute_ucx_listen_failed(r, lsn.error, 0);
		if (rc == 0 && uv_timer_init(loop, &lsn.timer) == 0) {
			lsn.timer_init = 1;
			lsn.backoff_ms = LISTEN_RETRY_FIRST_MS;
			uv_timer_start(&lsn.timer, listen_retry, lsn.backoff_ms, 0);
		}
	}
	if (rc < 0)
		return rc;
	dmetrics_set(DM_PEER_LISTENER, NULL, droute_ucx_address(r)[0] ? 1 : 0);
	droute_ucx_set_daemon(r);
	return 0;
}

static void peers_fini(void)
{
	if (lsn.timer_init) {
		uv_close((uv_handle_t *)&lsn.timer, NULL);
		lsn.timer_init = 0;
	}
	droute_ucx_close(droute_ucx_daemon(), NULL, NULL);
}

static void on_walk(uv_handle_t *h, void *arg)
{
	DLOG_E("handle of type %s still open at exit", uv_handle_type_name(h->type));
}

int main(int argc, char **argv)
{
	uv_loop_t loop;
	char err[512], why[256] = "";
	const struct dtc_backend *be;
	int rc, exit_code = 1;

	/* Capture buffers (positions, values, payloads: MiB to GiB, once per
	 * version, on whichever worker thread runs it) come from mmap and go
	 * back to the kernel when freed.  glibc's default raises this
	 * threshold after the first such free, and then freed buffers stay in
	 * each worker's arena: a sparse sync held the leftovers of earlier
	 * versions on top of its own (issue 8, daemon memory). */
	mallopt(M_MMAP_THRESHOLD, 256 * 1024);

	rc = parse_args(argc, argv);
	if (rc)
		return rc;
	dlog_init(opt.log_level >= 0 ? (enum dlog_level)opt.log_level : DLOG_NOTICE);
	if (load_conf(&conf, err, sizeof(err)) < 0) {
		DLOG_E("%s", err);
		return 1;
	}
	dlog_set_level(conf.log_level);
	umask(0027);

	/* Under auto, a node without CUDA is a CPU node, not a fault: one info
	 * line says which backend and why.  Asked for cuda by name, not
	 * getting it stays a warning. */
	be = dtc_backend_get(conf.compute_backend, why, sizeof(why));
	if (why[0] && strcmp(conf.compute_backend, "auto") == 0 &&
	    strcmp(dtc_backend_name(be), "cpu") == 0)
		DLOG_I("compute backend: cpu (auto: %s)",
		       strncmp(why, "cuda unavailable: ", 18) == 0 ? why + 18 : why);
	else if (why[0])
		DLOG_W("compute backend: %s", why);
	else
		DLOG_I("compute backend: %s (%s)", dtc_backend_name(be), dtc_backend_device(be));

	if (!opt.foreground && ddaemon_detach() < 0) {
		DLOG_E("cannot detach: fork failed");
		return 1;
	}

	srv.conf = &conf;
	srv.backend = dtc_backend_name(be);
	srv.start_ns = uv_hrtime();

	if (uv_loop_init(&loop) < 0) {
		DLOG_E("cannot create the event loop");
		return 1;
	}
	dreg_init();
	dmetrics_init();
	dcmd_ops_init(&srv);
	if (signals_init(&loop) < 0) {
		DLOG_E("cannot install signal handlers");
		goto out_signals;
	}
	if (dnotify_init(&loop) < 0)
		goto out_notify;
	if (peers_init(&loop) < 0)
		DLOG_E("peers: UCX unavailable; this daemon serves local jobs only");
	if (route_init(&loop, conf.node_name, droute_ucx_address(droute_ucx_daemon())) < 0) {
		DLOG_E("cannot start record routing");
		goto out_route;
	}
	droute_ucx_attach_engine(droute_ucx_daemon());
	/* The daemon's one sync engine; the control handlers reach it
	 * through srv (daemon/dreply.h). */
	if (!(srv.eng = dte_engine_new(&loop, be, srv.backend))) {
		DLOG_E("cannot start the sync engine");
		goto out_job;
	}
	job_auth_configure(srv.eng, conf.peer_auth, conf.peer_auth_off_jobs);
	srv.conn_gone = job_conn_gone;
	srv.answer = dctl_reply;	/* the engine's deferred answers (cmd_job.c) */
	job_set_max_staged(srv.eng, conf.max_staged_versions);
	job_set_part_bytes(srv.eng, (size_t)conf.peer_part_bytes);
	job_set_verify_full_every(srv.eng, conf.verify_full_every);
	side_set_cap(conf.mark_table_bytes);
	job_set_mode_policy(srv.eng, strcmp(conf.sync_mode, "sparse") ? 0 : 1);
	job_set_relay(srv.eng, conf.peer_relay_fanout, conf.peer_relay_roots,
		      conf.peer_relay_lag_ms);
	job_set_relay_shape(srv.eng, conf.peer_relay_measured, conf.peer_relay_rate_age_ms);
	{
		char perr[256];

		/* Jobs kept by the daemon before this one, created again before
		 * anyone is served (daemon/job_persist.c). */
		if (jpersist_init(srv.eng, conf.job_state_dir, perr, sizeof(perr)) < 0) {
			DLOG_E("%s", perr);
			goto out_ctl;
		}
		/* Every job created from now on is kept (the engine calls
		 * back; it knows nothing of persistence). */
		job_set_created_hook(srv.eng, jpersist_save);
		jpersist_restore(srv.eng);
	}
	if (dctl_init(&loop, &srv) < 0)
		goto out_ctl;
	/* Off by default; a listener that cannot bind is logged, not fatal:
	 * `dtectl metrics` still works. */
	if (conf.metrics_listen[0]) {
		dhttp_init(&loop, conf.metrics_listen);
		snprintf(srv.metrics_address, sizeof(srv.metrics_address), "%s", dhttp_address());
		snprintf(srv.metrics_error, sizeof(srv.metrics_error), "%s", dhttp_error());
	}

	DLOG_N("dted %s ready on %s (protocol %u, backend %s, node %s)", DTE_VERSION,
	       dctl_path(), DTE_PROTO_VERSION, srv.backend, conf.node_name);
	dnotify_ready("serving");
	dnotify_status("serving on %s", dctl_path());
	ddaemon_ready();

	uv_run(&loop, UV_RUN_DEFAULT);
	exit_code = 0;

	dhttp_fini();
	dctl_fini();
out_ctl:
	dte_engine_free(srv.eng);
	srv.eng = NULL;
out_job:
	droute_ucx_attach_engine(NULL);
	route_fini();
out_route:
	peers_fini();
	dnotify_fini();
out_notify:
	signals_fini();
out_signals:
	dmetrics_fini();
	dreg_fini();
	/* Let close callbacks run, then insist nothing was left behind. */
	uv_run(&loop, UV_RUN_DEFAULT);
	if (uv_loop_close(&loop) != 0) {
		uv_walk(&loop, on_walk, NULL);
		exit_code = 1;
	}
	DLOG_N("dted exiting (status %d)", exit_code);
	dlog_fini();
	return exit_code;
}
