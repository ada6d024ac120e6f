/*
 * The test workload of tests/inspect.rs: a small process tree holding one of each
 * thing `gpucr inspect` shows. Started as
 *     unshare --pid --fork setsid workload root PORT FILE READY
 *
 *   root        argv: workload root PORT FILE READY
 *               2 extra threads; FILE opened read-write at offset 1234; a memfd
 *               "gpucr-inspect-memfd" holding 8 KiB; a TCP listener on 127.0.0.1:PORT
 *               and an established loopback connection to it with 5 unread bytes; a
 *               private anonymous region filled with a pattern (16 MiB, or
 *               $GPUCR_INSPECT_MIB MiB for benchmarks); the write end of a pipe and
 *               one end of a unix socketpair
 *   child-a     argv: workload child-a alpha      the pipe's read end, 1 extra thread
 *   child-b     argv: workload child-b beta       the socketpair's other end, 1 thread
 *   grandchild  argv: workload grandchild gamma   child of child-b, 1 extra thread
 *
 * Every process but root is exec'ed from /proc/self/exe with its own argv and the
 * environment GPUCR_INSPECT_MARK=<role>, and names itself <role> (comm). Root also maps
 * the memfd shared. When all are set up, root creates READY; then every process sleeps
 * until killed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(2);
}

static void *sleeper(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static void start_threads(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, sleeper, NULL))
			die("pthread_create");
	}
}

/* Replace this process with /proc/self/exe ROLE ARG; it writes one byte to SYNC_FD
 * when it is ready. */
static void exec_role(const char *role, const char *arg, int sync_fd)
{
	char mark[64], sync_env[64];
	snprintf(mark, sizeof(mark), "GPUCR_INSPECT_MARK=%s", role);
	snprintf(sync_env, sizeof(sync_env), "GPUCR_INSPECT_SYNC=%d", sync_fd);
	char *argv[] = { "workload", (char *)role, (char *)arg, NULL };
	char *envp[] = { mark, sync_env, NULL };
	execve("/proc/self/exe", argv, envp);
	die("execve");
}

static void wait_ready(int fd, int count)
{
	char c;
	for (int i = 0; i < count; i++)
		if (read(fd, &c, 1) != 1)
			die("read sync");
	close(fd);
}

static void sleep_forever(void)
{
	for (;;) {
		/* Reap whatever exits (root is the PID namespace's init). */
		if (wait(NULL) < 0)
			pause();
	}
}

static int child(const char *role)
{
	const char *sync_env = getenv("GPUCR_INSPECT_SYNC");
	int sync_fd = sync_env ? atoi(sync_env) : -1;

	if (prctl(PR_SET_NAME, role, 0, 0, 0))
		die("prctl");

	if (!strcmp(role, "child-b")) {
		int sync[2];
		if (pipe(sync))
			die("pipe");
		pid_t pid = fork();
		if (pid < 0)
			die("fork");
		if (pid == 0) {
			close(sync[0]);
			if (sync_fd >= 0)
				close(sync_fd);
			exec_role("grandchild", "gamma", sync[1]);
		}
		close(sync[1]);
		wait_ready(sync[0], 1);
	}
	start_threads(1);
	if (sync_fd >= 0) {
		if (write(sync_fd, "x", 1) != 1)
			die("write sync");
		close(sync_fd);
	}
	sleep_forever();
	return 0;
}

static int root(int port, const char *path, const char *ready)
{
	int pfd[2], usk[2], sync[2];

	if (pipe(pfd) || socketpair(AF_UNIX, SOCK_STREAM, 0, usk) || pipe(sync))
		die("pipe/socketpair");

	int file = open(path, O_RDWR | O_CREAT, 0644);
	if (file < 0)
		die("open");
	if (lseek(file, 1234, SEEK_SET) != 1234)
		die("lseek");

	int memfd = memfd_create("gpucr-inspect-memfd", 0);
	if (memfd < 0)
		die("memfd_create");
	char page[8192];
	memset(page, 'm', sizeof(page));
	if (write(memfd, page, sizeof(page)) != (ssize_t)sizeof(page))
		die("write memfd");
	char *shared = mmap(NULL, sizeof(page), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (shared == MAP_FAILED)
		die("mmap memfd");
	shared[0] = 'M';

	int lsk = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	if (lsk < 0 || setsockopt(lsk, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		die("socket");
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(lsk, (struct sockaddr *)&addr, sizeof(addr)) || listen(lsk, 8))
		die("bind/listen");
	int csk = socket(AF_INET, SOCK_STREAM, 0);
	if (csk < 0 || connect(csk, (struct sockaddr *)&addr, sizeof(addr)))
		die("connect");
	int ask = accept(lsk, NULL, NULL);
	if (ask < 0)
		die("accept");
	if (write(csk, "hello", 5) != 5)
		die("write tcp");

	const char *mib = getenv("GPUCR_INSPECT_MIB");
	size_t big = (size_t)(mib ? atol(mib) : 16) << 20;
	unsigned char *mem = mmap(NULL, big, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < big; i++)
		mem[i] = (unsigned char)(i * 7 + 3);

	const char *roles[] = { "child-a", "child-b" };
	const char *args[] = { "alpha", "beta" };
	for (int i = 0; i < 2; i++) {
		pid_t pid = fork();
		if (pid < 0)
			die("fork");
		if (pid == 0) {
			/* child-a keeps the pipe's read end, child-b the socketpair's end. */
			int keep = i == 0 ? pfd[0] : usk[1];
			int fds[] = { pfd[0], pfd[1], usk[0], usk[1], sync[0], file,
				      memfd, lsk, csk, ask };
			for (unsigned j = 0; j < sizeof(fds) / sizeof(fds[0]); j++)
				if (fds[j] != keep)
					close(fds[j]);
			exec_role(roles[i], args[i], sync[1]);
		}
	}
	close(sync[1]);
	close(pfd[0]);
	close(usk[1]);
	wait_ready(sync[0], 2);
	start_threads(2);

	/* The ready file names the region's address: the kernel may merge the region
	 * with a neighbouring anonymous mapping (a thread's malloc arena), so the test
	 * looks for the mapping that holds it rather than one of exactly its size.
	 * Written aside and renamed, so that the file appears whole. */
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", ready);
	FILE *r = fopen(tmp, "w");
	if (!r)
		die("open ready");
	fprintf(r, "%lx %zu\n", (unsigned long)mem, big);
	if (fclose(r) != 0 || rename(tmp, ready) != 0)
		die("write ready");
	sleep_forever();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "root"))
		return root(atoi(argv[2]), argv[3], argv[4]);
	if (argc >= 3)
		return child(argv[1]);
	fprintf(stderr, "usage: workload root PORT FILE READY\n");
	return 2;
}
