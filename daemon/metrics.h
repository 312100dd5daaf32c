/* daemon/metrics.h — the daemon's counters, gauges and histograms, and
 * their Prometheus text exposition (format 0.0.4).
 *
 * Every family is declared once in metrics.c (name, help, type, at most
 * DMETRICS_LABELS labels, fixed histogram buckets), so what `dtectl
 * metrics` and the HTTP listener print cannot drift from what the code
 * updates.  A family with labels holds at most DMETRICS_SERIES series;
 * label values beyond that are counted under "_other" (every label of the
 * series "_other"; a gauge's "_other" holds the largest value set into it
 * since the family was last cleared), so a hostile or runaway label cannot
 * grow memory.  Pull-style families (the per-sink lag) are cleared and
 * set again by the collector before each rendering, so the series of a
 * sink or job that left disappear.  Updates take one mutex: they happen per version or per
 * request, never per element, and may come from a capture worker thread.
 */
#ifndef DTED_METRICS_H
#define DTED_METRICS_H

#include <stddef.h>

#define DMETRICS_SERIES    32
#define DMETRICS_LABEL_MAX 64
#define DMETRICS_LABELS    3     /* label names a family may have */

enum dmetric_id {
	DM_BUILD_INFO,            /* gauge{version} = 1 */
	DM_UPTIME,                /* gauge, seconds */
	DM_CLIENTS,               /* gauge: control connections open */
	DM_JOBS,                  /* gauge */
	DM_PEERS_UP,              /* gauge: peer daemons with a live link */
	DM_CONTROL_REQUESTS,      /* counter{command} */
	DM_REFUSED,               /* counter{reason} */
	DM_VERSIONS_PUBLISHED,    /* counter */
	DM_VERSIONS_APPLIED,      /* counter */
	DM_WIRE_BYTES,            /* counter{mode}: payload bytes sent */
	DM_ELEMENTS_CHANGED,      /* counter: elements sent (sparse) or extracted (dense) */
	DM_ELEMENTS_COVERED,      /* counter: elements the captures covered */
	DM_CHANGED_RATIO,         /* gauge: changed/covered of the last sparse capture */
	DM_PHASE_SECONDS,         /* histogram{phase}: capture, transfer, stage, apply */
	DM_CHECKSUM_FAILURES,     /* counter */
	DM_DENSE_FALLBACKS,       /* counter{reason} */
	DM_VERIFY,                /* counter{result} */
	DM_RESYNCS,               /* counter */
	DM_APPLY_VERIFY,          /* counter{kind}: sink checks after apply */
	DM_PEER_LISTENER,         /* gauge: 1 while the peer listener is bound */
	DM_SINKS_PARKED,          /* gauge: sinks whose client waits in wait_staged */
	DM_APPLY_ON_ARRIVAL,      /* counter{event}: part, version, undo, retreat (apply on arrival) */
	DM_MARK_TABLE_BYTES,      /* gauge: side tables of first marks held (side_table.h) */
	DM_MARK_TABLE_PEAK,       /* gauge: the most they held since the start */
	DM_MARK_TABLE_ELEMENTS,   /* counter{outcome}: kept, uncertain, over_cap, not_sent */
	DM_JOB_PUBLISHED_VERSION, /* gauge{job_name}: newest version the local sources published */
	DM_SINK_VERSIONS_BEHIND,  /* gauge{job_name,sink,sink_node}: that minus the sink's APPLIED */
	DM_FP8_UNITS,             /* counter{outcome}: FP8 sinks' units captured (covered) and sent */
	DM_RELAYED_BYTES,         /* counter{outcome}: bytes local sinks relayed (sent) or could not (failed) */
	DM_PLANS,                 /* counter{kind}: PLANs sent whole or as changes, taken as changes, changes refused */
	DM_RELAY_LAG,             /* counter{event}: relays planned as leaves for lagging (lagging), back (caught_up) */
	DM_LINK_RATE,             /* gauge{job_name,node}: this daemon's measured send rate toward node (RATES) */
	DM_RELAY_RESHAPES,        /* counter{cause}: re-plans for a relay shape the measured rates chose (measured) */
	DM__COUNT
};

/* Sets up the registry (build info, the label values that should show as
 * 0 before anything happened).  Idempotent; fini forgets every value. */
void dmetrics_init(void);
void dmetrics_fini(void);

/* `label` is the value of the family's label (NULL for a family without
 * one).  Counters only go up: dmetrics_add ignores negative amounts. */
void dmetrics_add(enum dmetric_id id, const char *label, double n);
void dmetrics_set(enum dmetric_id id, const char *label, double v);
void dmetrics_observe(enum dmetric_id id, const char *label, double v);
/* A mirrored monotonic count kept elsewhere (e.g. ctl.c's refusals):
 * raises the counter to `v`, never lowers it. */
void dmetrics_raise(enum dmetric_id id, const char *label, double v);
/* A gauge of a family with several labels: `labels` holds one value per
 * label name of the family, in its order. */
void dmetrics_set_labels(enum dmetric_id id, const char *const *labels, double v);
/* Forget every series of a family (a pull-style gauge the collector sets
 * again: what it does not set is gone from the exposition). */
void dmetrics_clear(enum dmetric_id id);

/* Called before every rendering to refresh pull-style gauges. */
void dmetrics_set_collector(void (*fn)(void *arg), void *arg);

/* The whole exposition, malloc()ed and NUL-terminated; NULL when out of
 * memory.  Runs the collector first. */
char *dmetrics_render(size_t *len);

/* One sample line, for structured (--json) output. */
struct dmetric_sample {
	char name[80];            /* with _bucket/_sum/_count for histograms */
	char labels[448];         /* `k="v",k2="v2"` as in the text, "" for none */
	double value;
};

/* Every sample in rendering order, malloc()ed; -1 when out of memory.
 * Runs the collector first. */
int dmetrics_samples(struct dmetric_sample **out, size_t *n);

/* Escape a label value for the text format (\\, \", \n) into dst;
 * returns the length it needed (like snprintf). */
size_t dmetrics_escape_label(char *dst, size_t cap, const char *v);

#endif
