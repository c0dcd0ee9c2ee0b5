/*
 * sametid PID PROG [ARG...]: runs PROG as a child whose pid is PID both in
 * the caller's PID namespace and in its parent (clone3 with set_tid; needs
 * CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), and exits with its status.
 * Exit 3: PID is taken in one of the two namespaces.
 *
 * readaheadd knows readers by the pids the kernel reports (the host's), so
 * in a container it finds a reader in its own /proc only if the reader has
 * the same pid in both: this starts such a reader.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: sametid PID PROG [ARG...]\n");
		return 2;
	}
	pid_t tids[2] = {atoi(argv[1]), atoi(argv[1])};
	struct clone_args ca;
	memset(&ca, 0, sizeof ca);
	ca.exit_signal = SIGCHLD;
	ca.set_tid = (uint64_t)(uintptr_t)tids;
	ca.set_tid_size = 2;
	long pid = syscall(SYS_clone3, &ca, sizeof ca);
	if (pid < 0) {
		fprintf(stderr, "clone3 with pid %d: %s\n", tids[0], strerror(errno));
		return errno == EEXIST ? 3 : 1;
	}
	if (pid == 0) {
		execvp(argv[2], argv + 2);
		fprintf(stderr, "exec %s: %s\n", argv[2], strerror(errno));
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) < 0)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
