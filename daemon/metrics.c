/* daemon/metrics.c — registry and Prometheus text exposition. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/metrics.h"

enum { T_COUNTER, T_GAUGE, T_HISTOGRAM };

/* Phase latencies: 100 µs (a small apply) to 30 s (a dense 60 GB model
 * over a slow link). */
static const double phase_buckets[] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
};
#define NB_MAX (sizeof(phase_buckets) / sizeof(phase_buckets[0]))

struct family {
	const char *name, *help;
	int type;
	const char *labels[DMETRICS_LABELS]; /* label names; NULL ends them (none: no label) */
	const double *buckets;
	unsigned nbuckets;
};

#define ARRAY_LEN(b) (unsigned)(sizeof(b) / sizeof((b)[0]))
static const struct family fam[DM__COUNT] = {
	[DM_BUILD_INFO] = { .name = "dted_build_info",
		.help = "dted version; always 1",
		.type = T_GAUGE,
		.labels = { "version" } },
	[DM_UPTIME] = { .name = "dted_uptime_seconds",
		.help = "Seconds since the daemon started",
		.type = T_GAUGE },
	[DM_CLIENTS] = { .name = "dted_control_clients",
		.help = "Control connections open now",
		.type = T_GAUGE },
	[DM_JOBS] = { .name = "dted_jobs",
		.help = "Jobs this daemon knows",
		.type = T_GAUGE },
	[DM_PEER_LISTENER] = { .name = "dted_peer_listener",
		.help = "1 while the peer listener is bound (0: its bind is being retried)",
		.type = T_GAUGE },
	[DM_PEERS_UP] = { .name = "dted_peers_up",
		.help = "Peer daemons with a live link",
		.type = T_GAUGE },
	[DM_CONTROL_REQUESTS] = { .name = "dted_control_requests_total",
		.help = "Control requests answered, by command",
		.type = T_COUNTER,
		.labels = { "command" } },
	[DM_REFUSED] = { .name = "dted_refused_total",
		.help = "Requests, connections and peer records refused, by reason",
		.type = T_COUNTER,
		.labels = { "reason" } },
	[DM_VERSIONS_PUBLISHED] = { .name = "dted_versions_published_total",
		.help = "Versions captured by local sources",
		.type = T_COUNTER },
	[DM_VERSIONS_APPLIED] = { .name = "dted_versions_applied_total",
		.help = "Versions applied by local sinks",
		.type = T_COUNTER },
	[DM_WIRE_BYTES] = { .name = "dted_wire_bytes_total",
		.help = "Payload bytes sent to sinks, by encoding",
		.type = T_COUNTER,
		.labels = { "mode" } },
	[DM_ELEMENTS_CHANGED] = { .name = "dted_elements_changed_total",
		.help = "Elements sent: changed (sparse) or every one (dense)",
		.type = T_COUNTER },
	[DM_ELEMENTS_COVERED] = { .name = "dted_elements_covered_total",
		.help = "Elements the captures covered",
		.type = T_COUNTER },
	[DM_CHANGED_RATIO] = { .name = "dted_changed_ratio",
		.help = "Changed fraction of the elements of the last sparse capture",
		.type = T_GAUGE },
	[DM_PHASE_SECONDS] = { .name = "dted_phase_seconds",
		.help = "Time per version phase (capture, transfer, stage, apply)",
		.type = T_HISTOGRAM,
		.labels = { "phase" },
		.buckets = phase_buckets, .nbuckets = ARRAY_LEN(phase_buckets) },
	[DM_CHECKSUM_FAILURES] = { .name = "dted_checksum_failures_total",
		.help = "Sink buffers whose checksum did not match after apply",
		.type = T_COUNTER },
	[DM_DENSE_FALLBACKS] = { .name = "dted_dense_fallbacks_total",
		.help = "Source-to-sink pairs sent dense, by reason",
		.type = T_COUNTER,
		.labels = { "reason" } },
	[DM_VERIFY] = { .name = "dted_verify_total",
		.help = "Sinks verified on request, by result",
		.type = T_COUNTER,
		.labels = { "result" } },
	[DM_RESYNCS] = { .name = "dted_resyncs_total",
		.help = "Pairs forced dense by a resync request",
		.type = T_COUNTER },
	[DM_SINKS_PARKED] = { .name = "dted_sinks_parked",
		.help = "Sinks parked at their safe point (a wait_staged outstanding): apply on arrival",
		.type = T_GAUGE },
	[DM_APPLY_ON_ARRIVAL] = { .name = "dted_apply_on_arrival_total",
		.help = "Apply on arrival at parked sinks: parts swapped in, versions staged in place, undone, retreated to staging",
		.type = T_COUNTER,
		.labels = { "event" } },
	[DM_APPLY_VERIFY] = { .name = "dted_apply_verifications_total",
		.help = "Sink checksum checks after apply, by kind (incremental, full)",
		.type = T_COUNTER,
		.labels = { "kind" } },
	[DM_MARK_TABLE_BYTES] = { .name = "dted_mark_table_bytes",
		.help = "Bytes held by the published values of first-marked elements (K > 1)",
		.type = T_GAUGE },
	[DM_MARK_TABLE_PEAK] = { .name = "dted_mark_table_peak_bytes",
		.help = "Most bytes those tables held at once since the daemon started",
		.type = T_GAUGE },
	[DM_MARK_TABLE_ELEMENTS] = { .name = "dted_mark_table_elements_total",
		.help = "First-marked elements by outcome (kept, uncertain, over_cap) and "
			"marked elements a publish did not send, back at the sink's value (not_sent)",
		.type = T_COUNTER,
		.labels = { "outcome" } },
	[DM_JOB_PUBLISHED_VERSION] = { .name = "dted_job_published_version",
		.help = "Newest version the job's sources on this daemon published",
		.type = T_GAUGE,
		.labels = { "job_name" } },
	[DM_SINK_VERSIONS_BEHIND] = { .name = "dted_sink_versions_behind",
		.help = "Versions a sink fed from this daemon is behind the newest version "
			"its sources published (from the sink's APPLIED acknowledgements)",
		.type = T_GAUGE,
		.labels = { "job_name", "sink", "sink_node" } },
	[DM_FP8_UNITS] = { .name = "dted_fp8_units_total",
		.help = "16-bit units of FP8 sinks' codes and scales the captures computed "
			"(covered) and sent (sent; docs/SYNC.md, \"FP8 sinks\")",
		.type = T_COUNTER,
		.labels = { "outcome" } },
	[DM_RELAYED_BYTES] = { .name = "dted_relayed_bytes_total",
		.help = "Bytes of COUNTS and PAYLOAD this daemon's sinks forwarded to their relay "
			"children (sent), or could not (failed: a send refused, a part that "
			"did not match its checksum; docs/SYNC.md, \"Relay between sink daemons\")",
		.type = T_COUNTER,
		.labels = { "outcome" } },
	[DM_PLANS] = { .name = "dted_plans_total",
		.help = "PLANs this daemon sent as coordinator, whole (sent_whole) or only what "
			"changed since the one acknowledged (sent_changes), and took as a member "
			"that carried only changes (taken_changes) or could not take, holding "
			"another plan (changes_refused; docs/SYNC.md, \"Membership\")",
		.type = T_COUNTER,
		.labels = { "kind" } },
	[DM_RELAY_LAG] = { .name = "dted_relay_lag_replans_total",
		.help = "Relays this daemon, as coordinator, planned as leaves because they lagged "
			"([peer] relay_lag_ms; lagging) and planned in their place again once "
			"caught up (caught_up; docs/SYNC.md, \"Relay between sink daemons\")",
		.type = T_COUNTER,
		.labels = { "event" } },
	[DM_LINK_RATE] = { .name = "dted_link_send_rate_bytes",
		.help = "Bytes per second this daemon measured sending a job's parts and relayed "
			"records toward a node, while any was in flight (reported to the coordinator "
			"for the relay shape; docs/SYNC.md, \"Relay shape from measured links\")",
		.type = T_GAUGE,
		.labels = { "job_name", "node" } },
	[DM_RELAY_RESHAPES] = { .name = "dted_relay_reshapes_total",
		.help = "Re-plans this daemon, as coordinator, made because the members' measured "
			"send rates chose another relay shape ([peer] relay_shape = measured; "
			"docs/SYNC.md, \"Relay shape from measured links\")",
		.type = T_COUNTER,
		.labels = { "cause" } },
};

struct series {
	char label[DMETRICS_LABELS][DMETRICS_LABEL_MAX];   /* "" past the family's labels */
	double value;                    /* counter, gauge; histogram: sum */
	unsigned long long count;        /* histogram */
	unsigned long long bucket[NB_MAX];  /* histogram, not cumulative */
};

struct fam_state {
	struct series s[DMETRICS_SERIES];
	unsigned n;
};

/* Process-wide, not engine state (struct dte_engine): one registry per
 * process, as Prometheus scrapes one daemon; every engine adds to it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fam_state st[DM__COUNT];
static void (*collector)(void *);
static void *collector_arg;

/* A label value as stored: at most DMETRICS_LABEL_MAX - 1 bytes, cut at
 * a character boundary so the exposition stays UTF-8. */
static void label_key(char *key, const char *label)
{
	size_t k = strlen(label);

	if (k < DMETRICS_LABEL_MAX) {
		memcpy(key, label, k + 1);
		return;
	}
	k = DMETRICS_LABEL_MAX - 1;
	while (k && ((unsigned char)label[k] & 0xC0) == 0x80)
		k--;	/* label[k] now starts a character (or k == 0) */
	memcpy(key, label, k);
	key[k] = '\0';
}

static unsigned nlabels(const struct family *f)
{
	unsigned n = 0;

	while (n < DMETRICS_LABELS && f->labels[n])
		n++;
	return n;
}

/* Locked.  The series for label values `vals` (one per label name of the
 * family; NULL: none); the last slot is "_other" once the family is full.
 * *other: set when the values had no series of their own and "_other"
 * stands for them.  NULL only for a bad id. */
static struct series *series_getv(enum dmetric_id id, const char *const *vals, int *other)
{
	char key[DMETRICS_LABELS][DMETRICS_LABEL_MAX];
	struct fam_state *f;
	unsigned i, k, nl;

	if (other)
		*other = 0;
	if ((unsigned)id >= DM__COUNT)
		return NULL;
	f = &st[id];
	nl = nlabels(&fam[id]);
	memset(key, 0, sizeof(key));
	for (k = 0; k < nl; k++)
		label_key(key[k], vals && vals[k] ? vals[k] : "");
	for (i = 0; i < f->n; i++)
		if (memcmp(f->s[i].label, key, sizeof(key)) == 0)
			return &f->s[i];
	if (f->n >= DMETRICS_SERIES - 1) {
		char okey[DMETRICS_LABELS][DMETRICS_LABEL_MAX];

		memset(okey, 0, sizeof(okey));
		for (k = 0; k < nl; k++)
			snprintf(okey[k], sizeof(okey[k]), "_other");
		if (memcmp(key, okey, sizeof(key))) {
			if (other)
				*other = 1;
			for (i = 0; i < f->n; i++)
				if (memcmp(f->s[i].label, okey, sizeof(okey)) == 0)
					return &f->s[i];
			memcpy(key, okey, sizeof(key));
		}
	}
	if (f->n == DMETRICS_SERIES)
		return &f->s[DMETRICS_SERIES - 1];
	memset(&f->s[f->n], 0, sizeof(f->s[f->n]));
	memcpy(f->s[f->n].label, key, sizeof(key));
	return &f->s[f->n++];
}

/* The same for a family with at most one label. */
static struct series *series_get(enum dmetric_id id, const char *label)
{
	return series_getv(id, label ? &label : NULL, NULL);
}

void dmetrics_add(enum dmetric_id id, const char *label, double n)
{
	struct series *s;

	if (!(n >= 0))
		return;
	pthread_mutex_lock(&lock);
	s = series_get(id, label);
	if (s && fam[id].type != T_HISTOGRAM)
		s->value += n;
	pthread_mutex_unlock(&lock);
}

void dmetrics_set(enum dmetric_id id, const char *label, double v)
{
	struct series *s;

	pthread_mutex_lock(&lock);
	s = series_get(id, label);
	if (s && fam[id].type == T_GAUGE)
		s->value = v;
	pthread_mutex_unlock(&lock);
}

void dmetrics_set_labels(enum dmetric_id id, const char *const *labels, double v)
{
	struct series *s;
	int other;

	pthread_mutex_lock(&lock);
	s = series_getv(id, labels, &other);
	if (s && fam[id].type == T_GAUGE && (!other || v > s->value))
		s->value = v;
	pthread_mutex_unlock(&lock);
}

void dmetrics_clear(enum dmetric_id id)
{
	if ((unsigned)id >= DM__COUNT)
		return;
	pthread_mutex_lock(&lock);
	st[id].n = 0;
	pthread_mutex_unlock(&lock);
}

void dmetrics_raise(enum dmetric_id id, const char *label, double v)
{
	struct series *s;

	pthread_mutex_lock(&lock);
	s = series_get(id, label);
	if (s && fam[id].type == T_COUNTER && v > s->value)
		s->value = v;
	pthread_mutex_unlock(&lock);
}

void dmetrics_observe(enum dmetric_id id, const char *label, double v)
{
	struct series *s;

	if (isnan(v))
		return;
	pthread_mutex_lock(&lock);
	s = series_get(id, label);
	if (s && fam[id].type == T_HISTOGRAM) {
		unsigned b;

		for (b = 0; b < fam[id].nbuckets && v > fam[id].buckets[b]; b++)
			;
		if (b < fam[id].nbuckets)
			s->bucket[b]++;
		s->count++;
		s->value += v;
	}
	pthread_mutex_unlock(&lock);
}

void dmetrics_set_collector(void (*fn)(void *arg), void *arg)
{
	pthread_mutex_lock(&lock);
	collector = fn;
	collector_arg = arg;
	pthread_mutex_unlock(&lock);
}

void dmetrics_init(void)
{
	static const char *const modes[] = { "sparse", "dense" };
	static const char *const phases[] = { "capture", "transfer", "stage", "apply" };
	static const char *const results[] = { "ok", "mismatch" };
	static const char *const kinds[] = { "incremental", "full" };

	pthread_mutex_lock(&lock);
	memset(st, 0, sizeof(st));
	for (unsigned i = 0; i < 2; i++) {
		static const char *const fp8[] = { "covered", "sent" };
		static const char *const relayed[] = { "sent", "failed" };

		series_get(DM_FP8_UNITS, fp8[i]);
		series_get(DM_RELAYED_BYTES, relayed[i]);
		series_get(DM_PLANS, i ? "sent_changes" : "sent_whole");
		series_get(DM_PLANS, i ? "changes_refused" : "taken_changes");
		series_get(DM_RELAY_LAG, i ? "caught_up" : "lagging");
		if (!i)
			series_get(DM_RELAY_RESHAPES, "measured");
		series_get(DM_WIRE_BYTES, modes[i]);
		series_get(DM_VERIFY, results[i]);
		series_get(DM_APPLY_VERIFY, kinds[i]);
	}
	for (unsigned i = 0; i < 4; i++) {
		static const char *const arrival[] = { "part", "version", "undo", "retreat" };
		static const char *const outcomes[] = { "kept", "uncertain", "over_cap", "not_sent" };

		series_get(DM_PHASE_SECONDS, phases[i]);
		series_get(DM_APPLY_ON_ARRIVAL, arrival[i]);
		series_get(DM_MARK_TABLE_ELEMENTS, outcomes[i]);
	}
	series_get(DM_BUILD_INFO, DTE_VERSION)->value = 1;
	for (unsigned i = 0; i < DM__COUNT; i++)
		if (!fam[i].labels[0])
			series_get((enum dmetric_id)i, NULL);
	pthread_mutex_unlock(&lock);
}

void dmetrics_fini(void)
{
	pthread_mutex_lock(&lock);
	memset(st, 0, sizeof(st));
	collector = NULL;
	collector_arg = NULL;
	pthread_mutex_unlock(&lock);
}

size_t dmetrics_escape_label(char *dst, size_t cap, const char *v)
{
	size_t n = 0;

	for (; *v; v++) {
		const char *rep = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
		char one[2] = { *v, 0 };

		if (!rep)
			rep = one;
		for (; *rep; rep++, n++)
			if (n + 1 < cap)
				dst[n] = *rep;
	}
	if (cap)
		dst[n < cap ? n : cap - 1] = '\0';
	return n;
}

/* HELP text escapes only \\ and \n. */
static void escape_help(char *dst, size_t cap, const char *v)
{
	size_t n = 0;

	for (; *v && n + 2 < cap; v++) {
		if (*v == '\\' || *v == '\n') {
			dst[n++] = '\\';
			dst[n++] = *v == '\n' ? 'n' : '\\';
		} else {
			dst[n++] = *v;
		}
	}
	dst[n] = '\0';
}

static void fmt_value(char *buf, size_t cap, double v)
{
	if (isnan(v))
		snprintf(buf, cap, "NaN");
	else if (isinf(v))
		snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 1e15)
		snprintf(buf, cap, "%.0f", v);
	else {
		/* The shortest of %.15g, %.16g, %.17g that reads back as v:
		 * 7.617, not 7.6169999999999999 (%.17g alone). */
		for (int prec = 15; prec <= 17; prec++) {
			snprintf(buf, cap, "%.*g", prec, v);
			if (strtod(buf, NULL) == v)
				break;
		}
	}
}

/* One walk over every sample, shared by the text and the sample list. */
struct walker {
	void (*family)(struct walker *w, const struct family *f);
	void (*sample)(struct walker *w, const char *name, const char *labels, double v);
	int failed;
};

static void series_labels(char *dst, size_t cap, const struct family *f, const struct series *s,
			  const char *le)
{
	char esc[DMETRICS_LABEL_MAX * 2 + 8];
	int n = 0;

	dst[0] = '\0';
	for (unsigned k = 0; k < DMETRICS_LABELS && f->labels[k]; k++) {
		int m;

		if (n < 0 || (size_t)n >= cap)
			break;
		dmetrics_escape_label(esc, sizeof(esc), s->label[k]);
		m = snprintf(dst + n, cap - (size_t)n, "%s%s=\"%s\"", n ? "," : "", f->labels[k], esc);
		n = m < 0 ? m : n + m;
	}
	if (le && n >= 0 && (size_t)n < cap)
		snprintf(dst + n, cap - (size_t)n, "%sle=\"%s\"", n ? "," : "", le);
}

static void walk(struct walker *w)
{
	char name[96], labels[sizeof(((struct dmetric_sample *)0)->labels)], le[32];

	for (unsigned i = 0; i < DM__COUNT; i++) {
		const struct family *f = &fam[i];

		w->family(w, f);
		for (unsigned k = 0; k < st[i].n; k++) {
			const struct series *s = &st[i].s[k];

			if (f->type != T_HISTOGRAM) {
				series_labels(labels, sizeof(labels), f, s, NULL);
				w->sample(w, f->name, labels, s->value);
				continue;
			}
			unsigned long long cum = 0;

			snprintf(name, sizeof(name), "%s_bucket", f->name);
			for (unsigned b = 0; b < f->nbuckets; b++) {
				cum += s->bucket[b];
				snprintf(le, sizeof(le), "%g", f->buckets[b]);
				series_labels(labels, sizeof(labels), f, s, le);
				w->sample(w, name, labels, (double)cum);
			}
			series_labels(labels, sizeof(labels), f, s, "+Inf");
			w->sample(w, name, labels, (double)s->count);
			series_labels(labels, sizeof(labels), f, s, NULL);
			snprintf(name, sizeof(name), "%s_sum", f->name);
			w->sample(w, name, labels, s->value);
			snprintf(name, sizeof(name), "%s_count", f->name);
			w->sample(w, name, labels, (double)s->count);
		}
	}
}

static void collect(void)
{
	void (*fn)(void *);
	void *arg;

	pthread_mutex_lock(&lock);
	fn = collector;
	arg = collector_arg;
	pthread_mutex_unlock(&lock);
	if (fn)
		fn(arg);
}

/* ---- text ---- */

struct text_walker {
	struct walker w;
	char *p;
	size_t n, cap;
};

static void text_put(struct text_walker *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void text_put(struct text_walker *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->w.failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->w.failed = 1;
			return;
		}
		if ((size_t)n < t->cap - t->n) {
			t->n += (size_t)n;
			return;
		}
		size_t nc = t->cap * 2 + (size_t)n;
		char *np = realloc(t->p, nc);

		if (!np) {
			t->w.failed = 1;
			return;
		}
		t->p = np;
		t->cap = nc;
	}
}

static void text_family(struct walker *w, const struct family *f)
{
	struct text_walker *t = (struct text_walker *)w;
	char help[256];

	escape_help(help, sizeof(help), f->help);
	text_put(t, "# HELP %s %s\n# TYPE %s %s\n", f->name, help, f->name,
		 f->type == T_COUNTER ? "counter" : f->type == T_GAUGE ? "gauge" : "histogram");
}

static void text_sample(struct walker *w, const char *name, const char *labels, double v)
{
	struct text_walker *t = (struct text_walker *)w;
	char val[40];

	fmt_value(val, sizeof(val), v);
	if (labels[0])
		text_put(t, "%s{%s} %s\n", name, labels, val);
	else
		text_put(t, "%s %s\n", name, val);
}

char *dmetrics_render(size_t *len)
{
	struct text_walker t = { .w = { text_family, text_sample, 0 } };

	collect();
	t.cap = 8192;
	t.p = malloc(t.cap);
	if (!t.p)
		return NULL;
	t.p[0] = '\0';
	pthread_mutex_lock(&lock);
	walk(&t.w);
	pthread_mutex_unlock(&lock);
	if (t.w.failed) {
		free(t.p);
		return NULL;
	}
	if (len)
		*len = t.n;
	return t.p;
}

/* ---- samples ---- */

struct sample_walker {
	struct walker w;
	struct dmetric_sample *s;
	size_t n, cap;
};

static void sample_family(struct walker *w, const struct family *f)
{
}

static void sample_sample(struct walker *w, const char *name, const char *labels, double v)
{
	struct sample_walker *sw = (struct sample_walker *)w;

	if (w->failed)
		return;
	if (sw->n == sw->cap) {
		size_t nc = sw->cap ? sw->cap * 2 : 128;
		struct dmetric_sample *np = realloc(sw->s, nc * sizeof(*np));

		if (!np) {
			w->failed = 1;
			return;
		}
		sw->s = np;
		sw->cap = nc;
	}
	snprintf(sw->s[sw->n].name, sizeof(sw->s[sw->n].name), "%s", name);
	snprintf(sw->s[sw->n].labels, sizeof(sw->s[sw->n].labels), "%s", labels);
	sw->s[sw->n].value = v;
	sw->n++;
}

int dmetrics_samples(struct dmetric_sample **out, size_t *n)
{
	struct sample_walker sw = { .w = { sample_family, sample_sample, 0 } };

	collect();
	pthread_mutex_lock(&lock);
	walk(&sw.w);
	pthread_mutex_unlock(&lock);
	if (sw.w.failed) {
		free(sw.s);
		return -1;
	}
	*out = sw.s;
	*n = sw.n;
	return 0;
}
