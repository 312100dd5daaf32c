/* tests/bench/peak_rss.h — this process's resident peak (VmHWM), for
 * the benches that hold many engines in one process (bench_replan.c,
 * bench_fanout_fixture.c). */
#ifndef DTE_BENCH_PEAK_RSS_H
#define DTE_BENCH_PEAK_RSS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MB; 0 when /proc cannot say. */
static inline double peak_mb(void)
{
	char line[256];
	double kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = strtod(line + 6, NULL);
	if (f)
		fclose(f);
	return kb / 1024.0;
}

#endif
