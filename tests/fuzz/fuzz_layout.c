/* tests/fuzz/fuzz_layout.c — declarative layout files ("json:FILE",
 * daemon/layout/gen_json.c) and layout description strings
 * (dte_layout_from_desc), over two tiny real model specs.
 *
 * Input: [mode u8][text...].  mode bit 0: the role (source/sink); bit 1:
 * the spec (dense GQA llama or qwen3 MoE); bit 2: the text is a layout
 * description string ("megatron:tp=2", "sglang:tp=4,ep=2", ...) instead of
 * the content of a JSON layout file (written to a memfd and loaded as
 * "json:/proc/self/fd/N").
 *
 * Properties: 0 or -1 with a message; on failure nothing is left to free
 * (ASan's leak check); on success, if dte_layout_validate accepts it,
 * every piece names a real tensor, its box lies inside the tensor and its
 * whole mapping lies inside its buffer(s) — checked here piece by piece
 * with the compute layer's dtc_entry_check, which is what guards every
 * kernel; then a plan against a generated other side is built, and every
 * plan entry must map inside both its source and its sink buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/layout/layout.h"
#include "daemon/layout/plan.h"
#include "daemon/layout/spec.h"
#include "gpu/compute.h"
#include "tests/fuzz/fuzz_util.h"

static const char *const spec_json[2] = {
	"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	" \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 8,"
	" \"vocab_size\": 300, \"tie_word_embeddings\": false}",
	"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
	" \"hidden_size\": 32, \"intermediate_size\": 64, \"moe_intermediate_size\": 16,"
	" \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"head_dim\": 8, \"num_experts\": 8, \"decoder_sparse_step\": 1,"
	" \"mlp_only_layers\": [1], \"vocab_size\": 200, \"tie_word_embeddings\": false}",
};
static struct dte_spec specs[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[256];

	for (int i = 0; i < 2; i++)
		if (dte_spec_load_string(&specs[i], spec_json[i], err, sizeof(err))) {
			fprintf(stderr, "fuzz_layout: spec %d: %s\n", i, err);
			abort();
		}
	return 0;
}

static int64_t buf_len(const struct dte_layout *l, uint32_t rank, uint32_t id)
{
	const struct dte_layout_buffer *b = dte_layout_buffer_find(l, rank, id);

	FUZZ_CHECK(b != NULL, "validated layout names missing buffer %u/%u", rank, id);
	return b->length;
}

static void check_pieces(const struct dte_layout *l, const struct dte_spec *spec)
{
	for (size_t i = 0; i < l->npieces; i++) {
		const struct dte_piece *p = &l->pieces[i];
		struct dte_box_map m = { .ndim = p->ndim, .dst_offset = p->offset };
		const struct dte_spec_tensor *t;

		FUZZ_CHECK(p->tensor < spec->n, "piece %zu: tensor %u", i, p->tensor);
		t = &spec->t[p->tensor];
		FUZZ_CHECK(p->ndim == t->ndim, "piece %zu: ndim %u for %s", i, p->ndim, t->name);
		for (uint32_t d = 0; d < p->ndim; d++) {
			FUZZ_CHECK(p->lo[d] >= 0 && p->lo[d] < p->hi[d] && p->hi[d] <= t->shape[d],
				   "piece %zu: dim %u box %lld:%lld outside %s", i, d,
				   (long long)p->lo[d], (long long)p->hi[d], t->name);
			m.extent[d] = p->hi[d] - p->lo[d];
			m.dst_stride[d] = p->stride[d];
		}
		FUZZ_CHECK(dtc_entry_check(&m, UINT64_MAX, (uint64_t)buf_len(l, p->rank, p->buf)) == 0,
			   "piece %zu (%s) maps outside buffer %u/%u", i, t->name, p->rank, p->buf);
		if (l->role == DTE_LAYOUT_SOURCE) {
			FUZZ_CHECK(dtc_entry_check(&m, UINT64_MAX,
						   (uint64_t)buf_len(l, p->rank, p->buf_m)) == 0 &&
				   dtc_entry_check(&m, UINT64_MAX,
						   (uint64_t)buf_len(l, p->rank, p->buf_v)) == 0,
				   "piece %zu (%s) maps outside its moment buffers", i, t->name);
		}
	}
}

static void check_plan(const struct dte_layout *l, const struct dte_spec *spec)
{
	int source = l->role == DTE_LAYOUT_SOURCE;
	struct dte_layout other;
	struct dte_plan plan;
	struct dte_plan_opts opts = { 0 };
	const struct dte_layout *src, *sink;
	char err[512];

	if (dte_layout_from_desc(&other, spec, source ? "sglang:tp=2" : "fsdp:dp=2",
				 source ? DTE_LAYOUT_SINK : DTE_LAYOUT_SOURCE, err, sizeof(err)))
		abort();
	src = source ? l : &other;
	sink = source ? &other : l;
	if (dte_plan_build(&plan, spec, src, sink, &opts, err, sizeof(err)) == 0) {
		for (size_t i = 0; i < plan.n; i++) {
			struct dte_plan_entry ent, *e = &ent;
			uint64_t sl, dl;

			dte_plan_entry(&plan, i, e);
			sl = (uint64_t)buf_len(src, e->src_rank, e->src_buf);
			dl = (uint64_t)buf_len(sink, e->sink_rank, e->sink_buf);

			FUZZ_CHECK(dtc_entry_check(&e->map, sl, dl) == 0,
				   "plan entry %zu maps outside its buffers", i);
			FUZZ_CHECK(dtc_entry_check(&e->map, (uint64_t)buf_len(src, e->src_rank,
									     e->src_buf_m), UINT64_MAX) == 0 &&
				   dtc_entry_check(&e->map, (uint64_t)buf_len(src, e->src_rank,
									     e->src_buf_v), UINT64_MAX) == 0,
				   "plan entry %zu maps outside its moment buffers", i);
		}
		dte_plan_fini(&plan);
	} else {
		FUZZ_CHECK(err[0], "plan failed without a message");
	}
	dte_layout_fini(&other);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	uint8_t mode = fuzz_u8(&in);
	int role = (mode & 1) ? DTE_LAYOUT_SINK : DTE_LAYOUT_SOURCE;
	const struct dte_spec *spec = &specs[(mode >> 1) & 1];
	char *text = fuzz_cstr(in.p, in.n), desc[64], err[512] = "";
	struct dte_layout l;
	int fd = -1, rc;

	if (mode & 4) {
		/* Descriptions naming a file are covered through the memfd. */
		if (strncmp(text, "json", 4) == 0 || strlen(text) > 256)
			goto out;
		rc = dte_layout_from_desc(&l, spec, text, role, err, sizeof(err));
	} else {
		fd = memfd_create("layout.json", MFD_CLOEXEC);
		FUZZ_CHECK(fd >= 0, "memfd_create");
		FUZZ_CHECK(in.n == 0 || write(fd, in.p, in.n) == (ssize_t)in.n, "write");
		snprintf(desc, sizeof(desc), "json:/proc/self/fd/%d", fd);
		rc = dte_layout_from_desc(&l, spec, desc, role, err, sizeof(err));
	}
	FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
	if (rc) {
		FUZZ_CHECK(err[0], "failed without a message");
		goto out;
	}
	if (dte_layout_validate(&l, spec, err, sizeof(err)) == 0) {
		check_pieces(&l, spec);
		check_plan(&l, spec);
	} else {
		FUZZ_CHECK(err[0], "validate failed without a message");
	}
	dte_layout_fini(&l);
out:
	if (fd >= 0)
		close(fd);
	free(text);
	return 0;
}
