/* Placeholder until the layout generators land. */
#include <stdio.h>
#include "daemon/layout/plan_cli.h"

int dte_plan_cli(int argc, char **argv)
{
	fprintf(stderr, "dtectl plan: layout generators not built yet\n");
	return 2;
}
