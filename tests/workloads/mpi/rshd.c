/* rshd: a minimal remote-shell daemon for namespace hosts (the server half
 * of the rsh pair that stands in for sshd/ssh; see README.md, "rsh").
 *
 *   rshd ADDR:PORT
 *
 * Listens on TCP ADDR:PORT (IPv4). For each connection it reads one command
 * line (bytes up to the first '\n', at most 64 KiB) and forks a child that
 * becomes a session leader (setsid, as sshd's session child does) and runs
 * `/bin/sh -c LINE` with the connection as its stdin, stdout and stderr
 * (stderr is merged into stdout). rshd keeps no copy of the connection, so
 * the child's tree owns it alone and the connection closes when the last
 * process of that tree closes it. Each child is reported on stdout as
 *   rshd: pid=PID cmd=LINE
 * (after "rshd: listening ADDR:PORT" at start), so that a test can find the
 * root of each host's part of a job. rshd reaps its children; SIGTERM ends
 * it (its children run on). Run it "on" a host, e.g.
 *   ip netns exec H unshare -u sh -c 'hostname H; exec rshd ADDR:PORT'
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_LINE 65536

static void reap(int sig)
{
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int listen_on(const char *spec)
{
    char host[64];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host) {
        fprintf(stderr, "rshd: bad address %s (want ADDR:PORT)\n", spec);
        exit(2);
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "rshd: bad IPv4 address %s\n", host);
        exit(2);
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s, 64) < 0) {
        fprintf(stderr, "rshd: listening on %s: %s\n", spec, strerror(errno));
        exit(1);
    }
    return s;
}

/* Reads the command line byte by byte (so that nothing after the '\n',
 * which belongs to the command's stdin, is consumed). 0 on success. */
static int read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (c == '\n') {
            buf[n] = 0;
            return 0;
        }
        if (n + 1 >= cap)
            return -1;
        buf[n++] = c;
    }
}

static void serve(int conn)
{
    static char line[MAX_LINE];
    if (read_line(conn, line, sizeof line) != 0) {
        fprintf(stderr, "rshd: a connection sent no command line\n");
        close(conn);
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "rshd: fork: %s\n", strerror(errno));
        close(conn);
        return;
    }
    if (pid == 0) {
        signal(SIGCHLD, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        setsid();
        if (dup2(conn, 0) < 0 || dup2(conn, 1) < 0 || dup2(conn, 2) < 0)
            _exit(127);
        if (conn > 2)
            close(conn);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    close(conn);
    printf("rshd: pid=%d cmd=%s\n", (int)pid, line);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: rshd ADDR:PORT\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = reap, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    int s = listen_on(argv[1]);
    printf("rshd: listening %s\n", argv[1]);
    fflush(stdout);
    for (;;) {
        int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            fprintf(stderr, "rshd: accept: %s\n", strerror(errno));
            return 1;
        }
        serve(c);
    }
}
