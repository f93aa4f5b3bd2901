/*
 * ycsb_report - latency histograms and YCSB-style output of ycsb_lmdb
 * (see ycsb_report.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "ycsb_report.h"

/* ---- latency histograms ------------------------------------------------- */

static unsigned int hist_index(uint64_t v)
{
	int msb, e;

	if (v < H_EXACT)
		return (unsigned int)v;
	msb = 63 - __builtin_clzll(v);
	if (msb > H_MAX_MSB) {
		v = (1ULL << (H_MAX_MSB + 1)) - 1;
		msb = H_MAX_MSB;
	}
	e = msb - 6;
	return (unsigned int)(H_EXACT + (e - 1) * H_SUB + (int)((v >> e) - H_SUB));
}

/* The largest value that lands in bucket @idx. */
static uint64_t hist_upper(unsigned int idx)
{
	unsigned int e, m;

	if (idx < H_EXACT)
		return idx;
	e = (idx - H_EXACT) / H_SUB + 1;
	m = (idx - H_EXACT) % H_SUB + H_SUB;
	return ((uint64_t)(m + 1) << e) - 1;
}

void hist_add(struct hist *h, uint64_t ns, enum status st)
{
	if (h->count == 0 || ns < h->min_ns)
		h->min_ns = ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
	h->count++;
	h->sum_ns += ns;
	h->status[st]++;
	h->b[hist_index(ns)]++;
}

void hist_merge(struct hist *into, const struct hist *h)
{
	if (h->count == 0)
		return;
	if (into->count == 0 || h->min_ns < into->min_ns)
		into->min_ns = h->min_ns;
	if (h->max_ns > into->max_ns)
		into->max_ns = h->max_ns;
	into->count += h->count;
	into->sum_ns += h->sum_ns;
	for (int i = 0; i < ST_COUNT; i++)
		into->status[i] += h->status[i];
	for (int i = 0; i < H_BUCKETS; i++)
		into->b[i] += h->b[i];
}

/* The @pct-th percentile in ns: the upper end of its bucket, at most the maximum. */
static uint64_t hist_percentile(const struct hist *h, double pct)
{
	uint64_t rank = (uint64_t)((pct / 100.0) * (double)h->count + 0.999999), seen = 0;

	if (rank == 0)
		rank = 1;
	for (unsigned int i = 0; i < H_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= rank) {
			uint64_t v = hist_upper(i);

			return v < h->max_ns ? v : h->max_ns;
		}
	}
	return h->max_ns;
}

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- output ------------------------------------------------------------- */

static FILE *csv_out;

int emit_open_csv(const char *path)
{
	csv_out = fopen(path, "w");
	if (!csv_out)
		return -errno;
	fprintf(csv_out, "section,metric,value\n");
	return 0;
}

int emit_close_csv(void)
{
	int rc = 0;

	if (csv_out && fclose(csv_out))
		rc = -errno;
	csv_out = NULL;
	return rc;
}

void emit(const char *section, const char *metric, const char *fmt, ...)
{
	char val[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(val, sizeof(val), fmt, ap);
	va_end(ap);
	printf("[%s], %s, %s\n", section, metric, val);
	if (csv_out)
		fprintf(csv_out, "%s,%s,%s\n", section, metric, val);
}

void emit_csv(const char *section, const char *metric, const char *fmt, ...)
{
	char val[64];
	va_list ap;

	if (!csv_out)
		return;
	va_start(ap, fmt);
	vsnprintf(val, sizeof(val), fmt, ap);
	va_end(ap);
	fprintf(csv_out, "%s,%s,%s\n", section, metric, val);
}

void emit_hist(const char *section, const struct hist *h)
{
	emit(section, "Operations", "%" PRIu64, h->count);
	emit(section, "AverageLatency(us)", "%.3f",
	     h->count ? (double)h->sum_ns / (double)h->count / 1000.0 : 0.0);
	emit(section, "MinLatency(us)", "%.1f", (double)h->min_ns / 1000.0);
	emit(section, "MaxLatency(us)", "%.1f", (double)h->max_ns / 1000.0);
	emit(section, "50thPercentileLatency(us)", "%.1f",
	     (double)hist_percentile(h, 50) / 1000.0);
	emit(section, "95thPercentileLatency(us)", "%.1f",
	     (double)hist_percentile(h, 95) / 1000.0);
	emit(section, "99thPercentileLatency(us)", "%.1f",
	     (double)hist_percentile(h, 99) / 1000.0);
	emit(section, "Return=OK", "%" PRIu64, h->status[ST_OK]);
	if (h->status[ST_NOT_FOUND])
		emit(section, "Return=NOT_FOUND", "%" PRIu64, h->status[ST_NOT_FOUND]);
	if (h->status[ST_ERROR])
		emit(section, "Return=ERROR", "%" PRIu64, h->status[ST_ERROR]);
}
