/*
 * ycsb_report - what ycsb_lmdb measures and prints: latency histograms, the
 * monotonic clock, and the YCSB-style output lines.
 *
 * emit() prints "[SECTION], Metric, value" on stdout and, once
 * emit_open_csv() succeeded, the same row as "section,metric,value" in the
 * CSV file; emit_csv() writes a row to the CSV file only.  The open CSV file
 * is this module's only state; emit_close_csv() closes it.
 */
#ifndef YCSB_REPORT_H
#define YCSB_REPORT_H

#include <stdint.h>

/*
 * Log-linear buckets of nanoseconds: exact below 128 ns, then 64 buckets per
 * power of two (at most 1/64 relative error), up to 2^48 ns.
 */
#define H_EXACT		128
#define H_SUB		64
#define H_MAX_MSB	47
#define H_BUCKETS	(H_EXACT + (H_MAX_MSB - 6) * H_SUB)

/* The outcome of one operation, counted per histogram as Return=... */
enum status { ST_OK, ST_NOT_FOUND, ST_ERROR, ST_COUNT };

/* The latencies of one kind of operation; all zero is an empty histogram. */
struct hist {
	uint64_t count, sum_ns, min_ns, max_ns;
	uint64_t status[ST_COUNT];
	uint64_t b[H_BUCKETS];
};

/* Count one operation that took @ns and ended with @st. */
void hist_add(struct hist *h, uint64_t ns, enum status st);

/* Add the counts of @h to @into. */
void hist_merge(struct hist *into, const struct hist *h);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t now_ns(void);

/*
 * Open @path for the CSV rows and write its header line; 0, or -errno when
 * it cannot be opened.
 */
int emit_open_csv(const char *path);

/* Close the CSV file if open; 0, or -errno when closing (flushing) failed. */
int emit_close_csv(void);

/* A "[SECTION], Metric, value" line, the value formatted by @fmt (at most 63 chars). */
void emit(const char *section, const char *metric, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A "section,metric,value" row in the CSV file only; nothing if none is open. */
void emit_csv(const char *section, const char *metric, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The YCSB lines of one histogram: operations, latencies (us), return counts. */
void emit_hist(const char *section, const struct hist *h);

#endif /* YCSB_REPORT_H */
