/* daemon/layout/plan_cli.h — `dtectl plan`, which needs no daemon.
 * argv[0] is "plan"; returns the process exit status. Output to stdout,
 * errors to stderr. */
#ifndef DTE_PLAN_CLI_H
#define DTE_PLAN_CLI_H

int dte_plan_cli(int argc, char **argv);

#endif
