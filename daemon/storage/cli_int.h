/* daemon/storage/cli_int.h — what the storage CLI's files share. */
#ifndef DTE_STORAGE_CLI_INT_H
#define DTE_STORAGE_CLI_INT_H

#include <stdint.h>
#include "daemon/storage/storage.h"

#define CLI_MAX_POS 4

/* Options of every subcommand, parsed once. */
struct cli {
	const char *sub;
	const char *pos[CLI_MAX_POS];
	int         npos;
	int         json, dry_run, keyframe;
	const char *spec, *config, *delta, *dense, *name, *state, *watch;
	int64_t     version, until;
	uint64_t    keep, keep_keyframes, keyframe_every, max_chunk, interval_ms;
	int         zlevel;
	double      stale_after, timeout;
	/* the model, from --spec or --config */
	struct dts_model model;
	uint64_t   *numel;
	uint64_t    total;
};

/* cli_model.c, below the subcommands: the model from --spec or --config
 * (0, or 1 after a message), and "dte-storage: <message>" on stderr
 * (returns 1, the failure status). */
int cli_load_model(struct cli *c);
int cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* cli_rw.c: the write and read subcommands (storage_cli.c dispatches). */
int cli_write(struct cli *c);
int cli_read(struct cli *c);

#endif
