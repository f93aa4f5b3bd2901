/* Shared by pmo_probe's files (pmo_probe.c has the usage of every check). */
#ifndef PROBE_H
#define PROBE_H

#include <stddef.h>

#include "pmo.h"
#include "pmo_ioctl.h"

/* The PMO key, from $PMO_KEY. */
extern const char *key;

#define FAIL(...) do { printf("fail " __VA_ARGS__); printf("\n"); return 1; } while (0)

/* Seconds on the monotonic clock. */
double now(void);

/* probe_access.c */
int wrongkey(const char *name, const char *bad);
int rowrite(const char *name);
int readers(const char *name);
int excl(const char *name);
int destroybusy(const char *name);
int detachmapped(const char *name);
int crash(const char *name);
int abi(const char *name);

/* probe_stats.c */
int wb(const char *name);
int stats(const char *name);
int stats_direct(const char *name);

/* probe_integrity.c */
int fill(const char *name);
int poisoned(const char *name, const char *page_s);
int kernel_write(const char *name, const char *page_s, const char *marker, int ahead,
		 int to_pipe);

/* probe_rebind.c */
int rebind(const char *name);

#endif
