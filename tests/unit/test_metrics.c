/* tests/unit/test_metrics.c — the metrics registry and its Prometheus
 * text exposition: HELP/TYPE per family, label escaping, cumulative
 * histogram buckets with +Inf, bounded series, the collector; and the
 * metrics_listen key with the config sources `dtectl config` reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/conf.h"
#include "daemon/metrics.h"

static int setup(void **state)
{
	dmetrics_init();
	return 0;
}

static int teardown(void **state)
{
	dmetrics_fini();
	return 0;
}

/* The value of the sample line "name{labels}" (labels "" for none); fails
 * the test when the line is missing or appears twice. */
static double value_of(const char *text, const char *name, const char *labels)
{
	char want[512];
	const char *p, *hit = NULL;

	if (labels[0])
		snprintf(want, sizeof(want), "\n%s{%s} ", name, labels);
	else
		snprintf(want, sizeof(want), "\n%s ", name);
	for (p = strstr(text, want); p; p = strstr(p + 1, want)) {
		if (hit)
			fail_msg("sample %s{%s} appears twice", name, labels);
		hit = p;
	}
	if (!hit)
		fail_msg("sample %s{%s} missing from:\n%s", name, labels, text);
	return strtod(hit + strlen(want), NULL);
}

/* A strict reading of the 0.0.4 text format: comments are HELP or TYPE
 * lines, TYPE comes once per family before its samples, every sample is
 * name[{k="v",...}] value with a name of the family (plus the histogram
 * suffixes) and properly escaped label values. */
static void check_format(const char *text)
{
	char family[96] = "", type[16] = "";
	const char *line = text;

	assert_true(text[0] && text[strlen(text) - 1] == '\n');
	while (*line) {
		const char *eol = strchr(line, '\n');
		char buf[1024], name[96];
		size_t n;

		assert_non_null(eol);
		n = (size_t)(eol - line);
		assert_true(n < sizeof(buf));
		memcpy(buf, line, n);
		buf[n] = '\0';
		line = eol + 1;
		if (!strncmp(buf, "# HELP ", 7))
			continue;
		if (!strncmp(buf, "# TYPE ", 7)) {
			assert_int_equal(sscanf(buf + 7, "%95s %15s", family, type), 2);
			assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge") ||
				    !strcmp(type, "histogram"));
			continue;
		}
		assert_true(buf[0] != '#');
		size_t k = strspn(buf, "abcdefghijklmnopqrstuvwxyz_:0123456789");
		assert_true(k > 0 && k < sizeof(name));
		memcpy(name, buf, k);
		name[k] = '\0';
		if (!strcmp(type, "histogram")) {
			size_t fl = strlen(family);

			assert_memory_equal(name, family, fl);
			assert_true(!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
				    !strcmp(name + fl, "_count"));
		} else {
			assert_string_equal(name, family);
		}
		const char *q = buf + k;
		if (*q == '{') {
			q++;
			while (*q != '}') {
				size_t kl = strspn(q, "abcdefghijklmnopqrstuvwxyz_");
				assert_true(kl > 0);
				q += kl;
				assert_true(q[0] == '=' && q[1] == '"');
				for (q += 2; *q != '"'; q++) {
					assert_true(*q != '\0');
					if (*q == '\\') {
						q++;
						assert_true(*q == '\\' || *q == '"' || *q == 'n');
					}
				}
				q++;
				if (*q == ',')
					q++;
				else
					assert_int_equal(*q, '}');
			}
			q++;
		}
		assert_int_equal(*q, ' ');
		char *end;
		q++;
		if (strcmp(q, "+Inf") && strcmp(q, "-Inf") && strcmp(q, "NaN")) {
			strtod(q, &end);
			assert_true(end != q && *end == '\0');
		}
	}
}

static void test_families_and_format(void **state)
{
	size_t len = 0;
	char *t = dmetrics_render(&len);

	assert_non_null(t);
	assert_int_equal(strlen(t), len);
	check_format(t);
	assert_non_null(strstr(t, "# TYPE dted_versions_published_total counter\n"));
	assert_non_null(strstr(t, "# TYPE dted_phase_seconds histogram\n"));
	assert_non_null(strstr(t, "# TYPE dted_peers_up gauge\n"));
	assert_non_null(strstr(t, "# HELP dted_dense_fallbacks_total "));
	assert_true(value_of(t, "dted_build_info", "version=\"" DTE_VERSION "\"") == 1);
	/* Families without labels show 0 before anything happened; so do the
	 * label values known in advance. */
	assert_true(value_of(t, "dted_versions_published_total", "") == 0);
	assert_true(value_of(t, "dted_wire_bytes_total", "mode=\"sparse\"") == 0);
	assert_true(value_of(t, "dted_phase_seconds_count", "phase=\"apply\"") == 0);
	free(t);
}

static void test_counters_and_escaping(void **state)
{
	char *t;

	dmetrics_add(DM_VERSIONS_PUBLISHED, NULL, 3);
	dmetrics_add(DM_VERSIONS_PUBLISHED, "ignored: no label", 2);
	dmetrics_add(DM_VERSIONS_PUBLISHED, NULL, -7);   /* counters never go down */
	dmetrics_set(DM_VERSIONS_PUBLISHED, NULL, 0);    /* nor are set */
	dmetrics_add(DM_WIRE_BYTES, "dense", 123456789012.0);
	dmetrics_add(DM_DENSE_FALLBACKS, "a\"b\\c\nd", 1);
	dmetrics_set(DM_CHANGED_RATIO, NULL, 0.0125);
	dmetrics_raise(DM_REFUSED, "credentials", 5);
	dmetrics_raise(DM_REFUSED, "credentials", 2);
	t = dmetrics_render(NULL);
	assert_non_null(t);
	check_format(t);
	assert_true(value_of(t, "dted_versions_published_total", "") == 5);
	assert_true(value_of(t, "dted_wire_bytes_total", "mode=\"dense\"") == 123456789012.0);
	assert_non_null(strstr(t, "\ndted_wire_bytes_total{mode=\"dense\"} 123456789012\n"));
	assert_true(value_of(t, "dted_dense_fallbacks_total", "reason=\"a\\\"b\\\\c\\nd\"") == 1);
	assert_true(value_of(t, "dted_changed_ratio", "") == 0.0125);
	assert_true(value_of(t, "dted_refused_total", "reason=\"credentials\"") == 5);
	free(t);
}

static void test_histogram(void **state)
{
	static const struct { const char *le; double want; } b[] = {
		{ "0.0001", 0 }, { "0.00025", 0 }, { "0.0005", 1 }, { "0.001", 1 },
		{ "0.0025", 2 }, { "1", 3 }, { "30", 3 }, { "+Inf", 4 },
	};
	char lab[64], *t;

	dmetrics_observe(DM_PHASE_SECONDS, "capture", 0.0003);
	dmetrics_observe(DM_PHASE_SECONDS, "capture", 0.0025);  /* le is inclusive */
	dmetrics_observe(DM_PHASE_SECONDS, "capture", 0.75);
	dmetrics_observe(DM_PHASE_SECONDS, "capture", 100);
	dmetrics_observe(DM_VERSIONS_APPLIED, NULL, 1);          /* not a histogram: ignored */
	t = dmetrics_render(NULL);
	assert_non_null(t);
	check_format(t);
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
		snprintf(lab, sizeof(lab), "phase=\"capture\",le=\"%s\"", b[i].le);
		if (value_of(t, "dted_phase_seconds_bucket", lab) != b[i].want)
			fail_msg("bucket le=%s: %g, want %g", b[i].le,
				 value_of(t, "dted_phase_seconds_bucket", lab), b[i].want);
	}
	assert_true(value_of(t, "dted_phase_seconds_count", "phase=\"capture\"") == 4);
	assert_float_equal(value_of(t, "dted_phase_seconds_sum", "phase=\"capture\""),
			   100.7528, 1e-9);
	assert_true(value_of(t, "dted_phase_seconds_count", "phase=\"stage\"") == 0);
	assert_true(value_of(t, "dted_versions_applied_total", "") == 0);
	free(t);
}

static void test_series_bounded(void **state)
{
	char lab[DMETRICS_LABEL_MAX * 3], *t;

	for (int i = 0; i < 40; i++) {
		snprintf(lab, sizeof(lab), "r%02d", i);
		dmetrics_add(DM_DENSE_FALLBACKS, lab, 1);
	}
	t = dmetrics_render(NULL);
	check_format(t);
	assert_true(value_of(t, "dted_dense_fallbacks_total", "reason=\"r00\"") == 1);
	assert_true(value_of(t, "dted_dense_fallbacks_total", "reason=\"r30\"") == 1);
	assert_null(strstr(t, "reason=\"r31\""));
	assert_true(value_of(t, "dted_dense_fallbacks_total", "reason=\"_other\"") == 9);
	free(t);

	/* A long UTF-8 label is cut at a character boundary, and the same
	 * long value lands in the same series every time. */
	lab[0] = '\0';
	for (int i = 0; i < 70; i++)
		strcat(lab, "\xc3\xa9");
	dmetrics_add(DM_VERIFY, lab, 1);
	dmetrics_add(DM_VERIFY, lab, 1);
	t = dmetrics_render(NULL);
	{
		const char *p = strstr(t, "dted_verify_total{result=\"\xc3\xa9");
		const char *q;

		assert_non_null(p);
		p = strchr(p, '"') + 1;
		q = strchr(p, '"');
		assert_true((size_t)(q - p) < DMETRICS_LABEL_MAX);
		assert_int_equal((q - p) % 2, 0);
		assert_int_equal(strtod(q + 3, NULL), 2);
	}
	free(t);
}

static int collected;
static void collector(void *arg)
{
	collected++;
	dmetrics_set(DM_PEERS_UP, NULL, *(int *)arg);
}

static void test_collector_and_samples(void **state)
{
	int peers = 3;
	struct dmetric_sample *s = NULL;
	size_t n = 0, lines = 0, found = 0;
	char *t;

	dmetrics_set_collector(collector, &peers);
	t = dmetrics_render(NULL);
	assert_int_equal(collected, 1);
	assert_true(value_of(t, "dted_peers_up", "") == 3);
	peers = 1;
	assert_int_equal(dmetrics_samples(&s, &n), 0);
	assert_int_equal(collected, 2);
	for (const char *p = t; *p; p = strchr(p, '\n') + 1)
		lines += *p != '#';
	assert_int_equal(n, lines);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(s[i].name, "dted_peers_up")) {
			found++;
			assert_string_equal(s[i].labels, "");
			assert_true(s[i].value == 1);
		}
	assert_int_equal(found, 1);
	free(s);
	free(t);
	dmetrics_set_collector(NULL, NULL);
}

/* A family with several labels (the per-sink lag): set per label tuple,
 * cleared and set again by a collector so a sink that left has no series;
 * past DMETRICS_SERIES the "_other" series holds the largest value.  And
 * non-integral values print in the fewest digits that read back exactly. */
static void test_labels_clear_and_floats(void **state)
{
	const char *a[] = { "job1", "0x1", "node-a" }, *b[] = { "job1", "0x2", "node\"b" };
	char *t;

	dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, a, 3);
	dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, b, 0);
	dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, a, 2);
	dmetrics_set(DM_UPTIME, NULL, 7.617);
	dmetrics_set(DM_CHANGED_RATIO, NULL, 0.1);
	t = dmetrics_render(NULL);
	assert_non_null(t);
	check_format(t);
	assert_true(value_of(t, "dted_sink_versions_behind",
			     "job_name=\"job1\",sink=\"0x1\",sink_node=\"node-a\"") == 2);
	assert_true(value_of(t, "dted_sink_versions_behind",
			     "job_name=\"job1\",sink=\"0x2\",sink_node=\"node\\\"b\"") == 0);
	assert_non_null(strstr(t, "\ndted_uptime_seconds 7.617\n"));
	assert_non_null(strstr(t, "\ndted_changed_ratio 0.1\n"));
	free(t);

	dmetrics_clear(DM_SINK_VERSIONS_BEHIND);
	dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, b, 1);
	t = dmetrics_render(NULL);
	assert_non_null(t);
	assert_null(strstr(t, "sink=\"0x1\""));
	assert_true(value_of(t, "dted_sink_versions_behind",
			     "job_name=\"job1\",sink=\"0x2\",sink_node=\"node\\\"b\"") == 1);
	free(t);

	dmetrics_clear(DM_SINK_VERSIONS_BEHIND);
	for (unsigned i = 0; i < DMETRICS_SERIES + 8; i++) {
		char id[16];
		const char *l[] = { "j", id, "n" };

		snprintf(id, sizeof(id), "0x%x", i);
		dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, l, i == DMETRICS_SERIES + 2 ? 99 : 1);
	}
	t = dmetrics_render(NULL);
	assert_non_null(t);
	check_format(t);
	assert_true(value_of(t, "dted_sink_versions_behind",
			     "job_name=\"_other\",sink=\"_other\",sink_node=\"_other\"") == 99);
	free(t);
}

static void test_escape_label(void **state)
{
	char small[4];

	assert_int_equal(dmetrics_escape_label(small, sizeof(small), "a\"b"), 4);
	assert_string_equal(small, "a\\\"");   /* truncated, still terminated */
}

/* metrics_listen: off by default; on = loopback only; PORT = loopback;
 * HOST:PORT as given; garbage refused with file:line.  Sources. */
static void test_conf_metrics_listen(void **state)
{
	static const struct { const char *in, *want; } ok[] = {
		{ "off", "" }, { "", "" }, { "on", "127.0.0.1:9370" }, { "9100", "127.0.0.1:9100" },
		{ "0.0.0.0:9100", "0.0.0.0:9100" }, { "[::1]:9100", "[::1]:9100" },
	};
	struct dconf c;
	char err[256], text[128], val[256];
	const char *sec, *key, *src;

	dconf_defaults(&c);
	assert_string_equal(c.metrics_listen, "");
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		dconf_defaults(&c);
		snprintf(text, sizeof(text), "[daemon]\nmetrics_listen = %s\n", ok[i].in);
		assert_int_equal(dconf_load_string(&c, text, "t.conf", err, sizeof(err)), 0);
		assert_string_equal(c.metrics_listen, ok[i].want);
	}
	dconf_defaults(&c);
	assert_int_equal(dconf_load_string(&c, "[daemon]\n\nmetrics_listen = maybe\n", "t.conf",
					   err, sizeof(err)), -1);
	assert_non_null(strstr(err, "t.conf:3: metrics_listen: invalid value 'maybe'"));

	dconf_defaults(&c);
	assert_int_equal(dconf_load_string(&c, "[daemon]\nlog_level = info\n[peer]\nlisten_port = 1\n",
					   "t.conf", err, sizeof(err)), 0);
	dconf_mark_flag(&c, DCONF_K_SOCKET);
	assert_int_equal(dconf_finish(&c, err, sizeof(err)), 0);
	for (unsigned i = 0; i < DCONF_K__COUNT; i++) {
		assert_int_equal(dconf_describe(&c, i, &sec, &key, val, sizeof(val), &src), 0);
		if (!strcmp(key, "log_level")) {
			assert_string_equal(val, "info");
			assert_string_equal(src, "file");
		} else if (!strcmp(key, "listen_port")) {
			assert_string_equal(sec, "peer");
			assert_string_equal(val, "1");
			assert_string_equal(src, "file");
		} else if (!strcmp(key, "socket")) {
			assert_string_equal(src, "flag");
		} else if (!strcmp(key, "metrics_listen")) {
			assert_string_equal(val, "off");
			assert_string_equal(src, "default");
		} else {
			assert_string_equal(src, "default");
		}
	}
	assert_int_equal(dconf_describe(&c, DCONF_K__COUNT, &sec, &key, val, sizeof(val), &src), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_families_and_format, setup, teardown),
		cmocka_unit_test_setup_teardown(test_counters_and_escaping, setup, teardown),
		cmocka_unit_test_setup_teardown(test_histogram, setup, teardown),
		cmocka_unit_test_setup_teardown(test_series_bounded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_collector_and_samples, setup, teardown),
		cmocka_unit_test_setup_teardown(test_labels_clear_and_floats, setup, teardown),
		cmocka_unit_test(test_escape_label),
		cmocka_unit_test(test_conf_metrics_listen),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
