/* daemon/layout/plan_main.c — `dte-plan`: the plan dry run on its own, the
 * same code as `dtectl plan`, for machines (and tests) without dtectl. */
#include "daemon/layout/plan_cli.h"

int main(int argc, char **argv)
{
	static char plan_name[] = "plan";

	if (argc > 0)
		argv[0] = plan_name;
	return dte_plan_cli(argc, argv);
}
