/* daemon/storage/storage_cli.h — `dte-storage` / `dtectl storage`, which
 * need no daemon: write, ls, gc, verify, read on a storage root.
 * argv[0] is "storage"; returns the process exit status (0 ok, 1 failure,
 * 2 usage).  Output to stdout, errors to stderr. */
#ifndef DTE_STORAGE_CLI_H
#define DTE_STORAGE_CLI_H

int dte_storage_cli(int argc, char **argv);

#endif
