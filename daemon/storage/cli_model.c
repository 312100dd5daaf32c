/* daemon/storage/cli_model.c — what every subcommand of the storage CLI
 * stands on: its error message (cli_err) and the model from --spec or
 * --config (cli_load_model).  Below both storage_cli.c (parsing,
 * dispatch, ls / gc / verify) and cli_rw.c (write, read), which call it
 * and never each other's helpers back.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <xxhash.h>
#include "daemon/layout/spec.h"
#include "daemon/storage/cli_int.h"

int cli_err(const char *fmt, ...)
{
	va_list ap;

	fputs("dte-storage: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* ---- the model ------------------------------------------------------ */

static int load_spec_json(struct cli *c)
{
	json_error_t je;
	json_t *root = json_load_file(c->spec, JSON_REJECT_DUPLICATES, &je), *ts, *t;
	const char *hex;
	XXH3_state_t *h = NULL;
	size_t i;
	int rc = 1;

	if (!root)
		return cli_err("%s: %s (line %d)", c->spec, je.text, je.line);
	ts = json_object_get(root, "tensors");
	if (!json_is_array(ts) || !json_array_size(ts) || json_array_size(ts) > (1u << 22)) {
		cli_err("%s: needs a non-empty \"tensors\" list", c->spec);
		goto out;
	}
	c->model.ntensors = (uint32_t)json_array_size(ts);
	if (!(c->numel = calloc(c->model.ntensors, sizeof(*c->numel))) ||
	    !(h = XXH3_createState())) {
		cli_err("out of memory");
		goto out;
	}
	XXH3_64bits_reset(h);
	json_array_foreach(ts, i, t) {
		const char *name = json_string_value(json_object_get(t, "name"));
		json_t *n = json_object_get(t, "numel");
		uint8_t le[8];

		if (!name || !json_is_integer(n) || json_integer_value(n) <= 0 ||
		    json_integer_value(n) > ((json_int_t)1 << 48)) {
			cli_err("%s: tensor %zu needs a name and a positive numel", c->spec, i);
			goto out;
		}
		c->numel[i] = (uint64_t)json_integer_value(n);
		c->total += c->numel[i];
		for (int b = 0; b < 8; b++)
			le[b] = (uint8_t)(c->numel[i] >> (8 * b));
		XXH3_64bits_update(h, name, strlen(name) + 1);
		XXH3_64bits_update(h, le, 8);
	}
	c->model.spec_hash = XXH3_64bits_digest(h);
	if ((hex = json_string_value(json_object_get(root, "spec_hash")))) {
		char *end;

		errno = 0;
		c->model.spec_hash = strtoull(hex, &end, 16);
		if (errno || end == hex || *end) {
			cli_err("%s: spec_hash is not hex", c->spec);
			goto out;
		}
	}
	c->model.numel = c->numel;
	rc = 0;
out:
	XXH3_freeState(h);
	json_decref(root);
	return rc;
}

int cli_load_model(struct cli *c)
{
	struct dte_spec spec;
	char err[256];

	if (!!c->spec == !!c->config)
		return cli_err("%s needs exactly one of --spec or --config", c->sub);
	if (c->spec)
		return load_spec_json(c);
	if (dte_spec_load_file(&spec, c->config, err, sizeof(err)) < 0)
		return cli_err("%s: %s", c->config, err);
	if (!(c->numel = calloc(spec.n, sizeof(*c->numel)))) {
		dte_spec_fini(&spec);
		return cli_err("out of memory");
	}
	for (uint32_t i = 0; i < spec.n; i++) {
		c->numel[i] = (uint64_t)spec.t[i].numel;
		c->total += c->numel[i];
	}
	c->model.ntensors = spec.n;
	c->model.numel = c->numel;
	c->model.spec_hash = spec.hash;
	dte_spec_fini(&spec);
	return 0;
}
