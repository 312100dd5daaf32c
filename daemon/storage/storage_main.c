/* daemon/storage/storage_main.c — `dte-storage`: the storage transport's
 * tool, the same code as `dtectl storage`, for operators and tests. */
#include "daemon/storage/storage_cli.h"

int main(int argc, char **argv)
{
	static char name[] = "storage";

	if (argc > 0)
		argv[0] = name;
	return dte_storage_cli(argc, argv);
}
