/* daemon/log.c — leveled logging to stderr, journald-aware. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include "daemon/log.h"

static const char *const level_names[] = {
	[DLOG_ERROR] = "error", [DLOG_WARN] = "warn", [DLOG_NOTICE] = "notice",
	[DLOG_INFO] = "info", [DLOG_DEBUG] = "debug",
};

/* Process-wide, not engine state: the daemon has one log. */
static enum dlog_level cur_level = DLOG_NOTICE;
static int to_journal;
static int to_syslog;

/* JOURNAL_STREAM is inherited by children that may have redirected stderr;
 * only trust it when it names the stderr we actually have. */
static int stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2)
		return 0;
	if (fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void dlog_init(enum dlog_level level)
{
	cur_level = level;
	to_journal = stderr_is_journal();
}

void dlog_fini(void)
{
	if (to_syslog)
		closelog();
	to_syslog = 0;
	fflush(stderr);
}

void dlog_to_syslog(void)
{
	openlog("dted", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	to_syslog = 1;
}

void dlog_set_level(enum dlog_level level)
{
	cur_level = level;
}

enum dlog_level dlog_get_level(void)
{
	return cur_level;
}

int dlog_level_parse(const char *name)
{
	for (int l = DLOG_ERROR; l <= DLOG_DEBUG; l++)
		if (name && strcmp(name, level_names[l]) == 0)
			return l;
	if (name && strcmp(name, "warning") == 0)
		return DLOG_WARN;
	return -1;
}

const char *dlog_level_name(enum dlog_level level)
{
	if (level < DLOG_ERROR || level > DLOG_DEBUG)
		return "?";
	return level_names[level];
}

void dlog(enum dlog_level level, const char *fmt, ...)
{
	char line[1024];
	int n = 0;
	va_list ap;

	if (level > cur_level)
		return;
	if (to_syslog) {
		va_start(ap, fmt);
		vsyslog((int)level, fmt, ap);
		va_end(ap);
		return;
	}
	if (to_journal) {
		n = snprintf(line, sizeof(line), "<%d>", (int)level);
	} else {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		n = (int)strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
		n += snprintf(line + n, sizeof(line) - (size_t)n, ".%03ld dted[%d] %s: ",
			      ts.tv_nsec / 1000000, (int)getpid(), level_names[level]);
	}
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write per line keeps lines whole when several processes share
	 * the stream. */
	fprintf(stderr, "%s\n", line);
}
