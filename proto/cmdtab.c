/* proto/cmdtab.c — the command table, expanded from DTE_CMD_LIST. */
#include <string.h>
#include "proto/cmdtab.h"

const struct dte_cmd dte_cmdtab[DTE_CMD__COUNT] = {
#define DTE_CMD_ROW(id, name, field, flags, usage, summary) \
	[DTE_CMD_##id] = { DTE_CMD_##id, name, field, flags, usage, summary },
	DTE_CMD_LIST(DTE_CMD_ROW)
#undef DTE_CMD_ROW
};

const struct dte_cmd *dte_cmd_by_name(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < DTE_CMD__COUNT; i++)
		if (strcmp(dte_cmdtab[i].name, name) == 0)
			return &dte_cmdtab[i];
	return NULL;
}

const struct dte_cmd *dte_cmd_by_field(unsigned field)
{
	if (field == 0)
		return NULL;
	for (size_t i = 0; i < DTE_CMD__COUNT; i++)
		if (dte_cmdtab[i].field == field)
			return &dte_cmdtab[i];
	return NULL;
}
