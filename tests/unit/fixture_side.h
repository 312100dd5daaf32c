/* tests/unit/fixture_side.h — a client's buffers and its trainer, as the
 * engine's in-process tests hold them (tests/unit/fixture_sync.c): the
 * model, memfd buffers registered under a connection, torch's AdamW step
 * on the source.  Shared by the fixture's sync tests (fixture_sync.h
 * includes it) and test_job.c.  Include after <cmocka.h>. */
#ifndef DTE_TEST_FIXTURE_SIDE_H
#define DTE_TEST_FIXTURE_SIDE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/layout/layout.h"
#include "gpu/compute.h"

#define FXS_MAXB 64

/* The model (tests/data/layout/tiny-llama-gqa.json), loaded by
 * fxs_setup. */
extern char *fxs_config;
extern struct dte_spec fxs_spec;

/* One client's buffers: a trainer's (fp32 θ, m, v) or an SGLang sink's
 * (bf16 weights), rank 0 of its layout.  The memory is the client's: it
 * outlives a connection (side_reregister hands it to a new one). */
struct side {
	size_t n;
	uint64_t ids[FXS_MAXB];		/* registry ids under its connection now */
	uint32_t layout_ids[FXS_MAXB];
	void *mem[FXS_MAXB];
	size_t bytes[FXS_MAXB];
	int fds[FXS_MAXB];		/* the memfds, kept for a new connection */
	int role;			/* DTE_LAYOUT_SOURCE | DTE_LAYOUT_SINK */
	char names[FXS_MAXB][DTE_LAYOUT_NAME_MAX];
	uint64_t participant;
};

/* cmocka group setup/teardown: the model, the log level (FX_DEBUG). */
int fxs_setup(void **state);
int fxs_teardown(void **state);

/* New zeroed memfds for layout desc's rank 0, registered under conn. */
void side_register(struct side *sd, uint64_t conn, const char *desc, int role);
/* The same memory registered again under conn (a new connection: the old
 * one's registrations went with it). */
void side_reregister(struct side *sd, uint64_t conn);
void side_unmap(struct side *sd);

/* The trainer's learning rate (1e-3 unless a bench sets another). */
extern double fxs_lr;
struct dtc_hparams hp_of(int64_t step);
/* One AdamW step over every element of the source (torch's single-tensor
 * AdamW; θ by ref_torch_adamw), gradients drawn from seed. */
void adamw_step(struct side *src, int64_t step, unsigned seed);

#endif
