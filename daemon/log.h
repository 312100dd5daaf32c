/* daemon/log.h — leveled logging to stderr.
 *
 * Under systemd (stderr is the journal stream named by JOURNAL_STREAM) each
 * line starts with a "<N>" priority prefix (sd-daemon.h) so journald files
 * it at the right level; otherwise lines carry a local timestamp.
 */
#ifndef DTED_LOG_H
#define DTED_LOG_H

/* Values are syslog priorities, so they double as journald prefixes. */
enum dlog_level {
	DLOG_ERROR = 3,
	DLOG_WARN = 4,
	DLOG_NOTICE = 5,
	DLOG_INFO = 6,
	DLOG_DEBUG = 7,
};

void dlog_init(enum dlog_level level);
void dlog_fini(void);

/* From now on log to syslog (a detached daemon has no stderr worth
 * writing to). */
void dlog_to_syslog(void);

void dlog_set_level(enum dlog_level level);
enum dlog_level dlog_get_level(void);

/* "error", "warn", "notice", "info", "debug"; -1 when unknown. */
int dlog_level_parse(const char *name);
const char *dlog_level_name(enum dlog_level level);

void dlog(enum dlog_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define DLOG_E(...) dlog(DLOG_ERROR, __VA_ARGS__)
#define DLOG_W(...) dlog(DLOG_WARN, __VA_ARGS__)
#define DLOG_N(...) dlog(DLOG_NOTICE, __VA_ARGS__)
#define DLOG_I(...) dlog(DLOG_INFO, __VA_ARGS__)
#define DLOG_D(...) dlog(DLOG_DEBUG, __VA_ARGS__)

#endif
