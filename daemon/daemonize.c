/* daemon/daemonize.c — fork, setsid, report readiness through a pipe. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "daemon/daemonize.h"
#include "daemon/log.h"

static int ready_fd = -1;

int ddaemon_detach(void)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid > 0) {
		char b;
		ssize_t n;

		close(p[1]);
		do
			n = read(p[0], &b, 1);
		while (n < 0);
		if (n == 1)
			_exit(0);
		/* The child exited before ready: pass its status on. */
		int st = 0;

		waitpid(pid, &st, 0);
		_exit(WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
	}
	close(p[0]);
	ready_fd = p[1];
	setsid();
	int nul = open("/dev/null", O_RDWR);

	if (nul >= 0) {
		dup2(nul, STDIN_FILENO);
		if (nul != STDIN_FILENO)
			close(nul);
	}
	return 0;
}

void ddaemon_ready(void)
{
	int nul;

	if (ready_fd < 0)
		return;
	/* Startup errors went to the terminal; from here on the terminal may
	 * be gone, so logs go to syslog and stdio to /dev/null (which also
	 * lets a caller waiting for our output see EOF). */
	dlog_to_syslog();
	nul = open("/dev/null", O_RDWR);
	if (nul >= 0) {
		dup2(nul, STDOUT_FILENO);
		dup2(nul, STDERR_FILENO);
		if (nul > STDERR_FILENO)
			close(nul);
	}
	if (write(ready_fd, "R", 1) != 1)
		DLOG_W("could not signal readiness to the parent");
	close(ready_fd);
	ready_fd = -1;
}
