/*
 * fb_report.c - a run's result as Filebench prints it, or as CSV.
 *
 * Filebench's units: "mb/s" is MiB (2^20 bytes) per second, "ms/op" the mean
 * latency of the flowop, and the IO Summary's rd/wr are read and write
 * flowops per second.
 */
#include <stdarg.h>
#include <stdio.h>

#include "fb_internal.h"

/* A bounded text buffer that counts what it would need. */
struct out {
	char *buf;
	size_t len;
	size_t used;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	size_t room = o->used < o->len ? o->len - o->used : 0;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(room ? o->buf + o->used : NULL, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->used += (size_t)n;
}

static double per_s(uint64_t x, double secs)
{
	return secs > 0 ? (double)x / secs : 0.0;
}

static const char *kind_name(uint32_t k)
{
	return k == FB_KIND_READ ? "read" : k == FB_KIND_WRITE ? "write" : "other";
}

static void counters_text(struct out *o, const char *what, const struct fb_counters *c)
{
	put(o, "%s: %llu creates, %llu destroys, %llu attaches, %llu detaches, %llu psyncs, "
	       "%llu B read, %llu B written, %llu truncated writes (%llu B), %llu pick waits, "
	       "%llu verify errors\n", what,
	    (unsigned long long)c->creates, (unsigned long long)c->destroys,
	    (unsigned long long)c->attaches, (unsigned long long)c->detaches,
	    (unsigned long long)c->psyncs, (unsigned long long)c->bytes_read,
	    (unsigned long long)c->bytes_written, (unsigned long long)c->truncated_writes,
	    (unsigned long long)c->truncated_bytes, (unsigned long long)c->pick_waits,
	    (unsigned long long)c->verify_errors);
}

static void counters_csv(struct out *o, const struct fb_counters *c)
{
	put(o, ",%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n",
	    (unsigned long long)c->creates, (unsigned long long)c->destroys,
	    (unsigned long long)c->attaches, (unsigned long long)c->detaches,
	    (unsigned long long)c->psyncs, (unsigned long long)c->bytes_read,
	    (unsigned long long)c->bytes_written, (unsigned long long)c->truncated_writes,
	    (unsigned long long)c->truncated_bytes, (unsigned long long)c->pick_waits,
	    (unsigned long long)c->verify_errors);
}

size_t fb_format(const struct fb_result *res, int csv, char *buf, size_t len)
{
	struct out o = { buf, len, 0 };
	const char *pname = fb_personality_name(res->personality);
	double secs = (double)res->elapsed_ns / 1e9;
	uint64_t ops = 0, rd = 0, wr = 0, bytes = 0, ns = 0;
	uint32_t n = res->nflowops < FB_MAX_FLOWOPS ? res->nflowops : FB_MAX_FLOWOPS;

	if (len)
		buf[0] = '\0';
	if (!pname)
		pname = "unknown";
	for (uint32_t i = 0; i < n; i++) {
		const struct fb_flowop_stat *s = &res->flowops[i];

		ops += s->ops;
		ns += s->ns;
		bytes += s->bytes;
		rd += s->kind == FB_KIND_READ ? s->ops : 0;
		wr += s->kind == FB_KIND_WRITE ? s->ops : 0;
	}
	if (csv) {
		put(&o, "personality,row,kind,ops,bytes,ns,ops_per_s,mb_per_s,ms_per_op,creates,"
			"destroys,attaches,detaches,psyncs,bytes_read,bytes_written,"
			"truncated_writes,truncated_bytes,pick_waits,verify_errors\n");
		for (uint32_t i = 0; i < n; i++) {
			const struct fb_flowop_stat *s = &res->flowops[i];

			put(&o, "%s,%s,%s,%llu,%llu,%llu,%.3f,%.3f,%.6f,,,,,,,,,,,\n", pname,
			    s->name, kind_name(s->kind), (unsigned long long)s->ops,
			    (unsigned long long)s->bytes, (unsigned long long)s->ns,
			    per_s(s->ops, secs), per_s(s->bytes, secs) / 1048576.0,
			    s->ops ? (double)s->ns / (double)s->ops / 1e6 : 0.0);
		}
		put(&o, "%s,IO Summary,all,%llu,%llu,%llu,%.3f,%.3f,%.6f", pname,
		    (unsigned long long)ops, (unsigned long long)bytes,
		    (unsigned long long)res->elapsed_ns, per_s(ops, secs),
		    per_s(bytes, secs) / 1048576.0, ops ? (double)ns / (double)ops / 1e6 : 0.0);
		counters_csv(&o, &res->run);
		put(&o, "%s,prepare,all,,,,,,", pname);
		counters_csv(&o, &res->prepare);
		return o.used;
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct fb_flowop_stat *s = &res->flowops[i];

		put(&o, "%-20s %10lluops %9.0fops/s %7.1fmb/s %9.3fms/op [%.3fms - %.3fms]\n",
		    s->name, (unsigned long long)s->ops, per_s(s->ops, secs),
		    per_s(s->bytes, secs) / 1048576.0,
		    s->ops ? (double)s->ns / (double)s->ops / 1e6 : 0.0, (double)s->min_ns / 1e6,
		    (double)s->max_ns / 1e6);
	}
	put(&o, "IO Summary: %llu ops %.3f ops/s %.0f/%.0f rd/wr %.1fmb/s %.3fms/op\n",
	    (unsigned long long)ops, per_s(ops, secs), per_s(rd, secs), per_s(wr, secs),
	    per_s(bytes, secs) / 1048576.0, ops ? (double)ns / (double)ops / 1e6 : 0.0);
	put(&o, "Run: %s, %u files, %u threads, %llu loops in %.3f s; %llu files (%llu B) at end\n",
	    pname, res->nfiles, res->nthreads, (unsigned long long)res->loops, secs,
	    (unsigned long long)res->files_at_end, (unsigned long long)res->bytes_at_end);
	counters_text(&o, "PMO run", &res->run);
	counters_text(&o, "PMO prepare", &res->prepare);
	return o.used;
}
