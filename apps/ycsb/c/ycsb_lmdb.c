/*
 * ycsb_lmdb - the YCSB core workloads A-F (ycsb.h) on LMDB.
 *
 *   ycsb_lmdb --workload a --records N --ops N --dir DIR [--file | --pmo KEYFILE]
 *             [--threads N] [--seed S] [--batch N] [--load-batch N] [--phase load|run|both]
 *             [--write-all-fields] [--verify] [--nosync] [--map-size SIZE]
 *             [--csv FILE] [--log-commits]
 *   ycsb_lmdb --check [--dump] --dir DIR [--file | --pmo KEYFILE]
 *
 * Load phase: insert records 0..N-1 (key "user<fnv>", 10 x 100-byte fields,
 * stored as one 1000-byte LMDB value), committing every --load-batch inserts.
 * Run phase: --ops operations split over --threads threads, each with its own
 * generator (seed, thread index).  READ = mdb_get in a read-only txn (or in
 * the thread's open write txn when batching); SCAN = a cursor from the first
 * key >= the start key over up to scan_len records; UPDATE = read the record,
 * replace the chosen field (or all with --write-all-fields), put it back, in a
 * write txn; INSERT = put; READ-MODIFY-WRITE = read then write the record in
 * one write txn.  Write txns commit after every --batch write ops (default 1:
 * every op commits).  LMDB's single writer: a thread with an open write txn
 * holds LMDB's writer lock; the others wait in mdb_txn_begin.
 *
 * Output: YCSB-style lines "[SECTION], Metric, value" on stdout ([LOAD],
 * [LOAD-INSERT], [OVERALL], [READ], [UPDATE], [INSERT], [SCAN],
 * [READ-MODIFY-WRITE]); --csv FILE writes the same rows as
 * "section,metric,value".  --log-commits prints "COMMIT <OP> <key> <keynum>
 * <version> <field|all>" for every write, after its txn committed.
 *
 * --check walks the whole database and verifies every record (ycsb.h's
 * self-describing field format); --dump also prints
 * "RECORD <key> <keynum> <v0> .. <v9>" (the version of each field).
 * Exit status: 0, 1 on errors (or corrupt records for --check), 2 on usage.
 *
 * Files: this one runs the phases (load, run, --check) and holds main();
 * ycsb_worker.c is one thread's operations and txns on LMDB; ycsb_env.c
 * opens the environment (plain files, or its PMO backend); ycsb_cli.c parses
 * the command line into struct config (ycsb_config.h); ycsb_report.c keeps
 * the latency histograms and prints the output lines; ycsb.c is the workload
 * generator.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmdb.h"
#include "ycsb.h"
#include "ycsb_cli.h"
#include "ycsb_config.h"
#include "ycsb_env.h"
#include "ycsb_report.h"
#include "ycsb_worker.h"

/* ---- phases ------------------------------------------------------------- */

static int load_phase(const struct config *cfg, MDB_env *env, MDB_dbi dbi)
{
	struct worker *w = worker_new(cfg, env, dbi, cfg->load_batch);
	uint64_t t0, t1, lost;
	int err;

	if (!w) {
		fprintf(stderr, "ycsb_lmdb: out of memory\n");
		return 1;
	}
	w->loading = 1;
	t0 = now_ns();
	for (uint64_t i = 0; i < cfg->records && !w->err; i++) {
		uint64_t s;
		enum status st;

		ycsb_load_op(i, &w->op);
		s = now_ns();
		st = worker_write(w, &w->op);
		hist_add(&w->h[YCSB_OP_INSERT], now_ns() - s, st);
	}
	if (worker_commit(w) && !w->err)
		w->err = EIO;
	t1 = now_ns();
	emit("LOAD", "Records", "%" PRIu64, cfg->records);
	emit("LOAD", "RunTime(ms)", "%" PRIu64, (t1 - t0) / 1000000);
	emit("LOAD", "Throughput(ops/sec)", "%.1f",
	     t1 > t0 ? (double)w->h[YCSB_OP_INSERT].count * 1e9 / (double)(t1 - t0) : 0.0);
	emit_hist("LOAD-INSERT", &w->h[YCSB_OP_INSERT]);
	lost = w->lost;
	err = w->err;
	if (lost)
		emit("LOAD", "LostWrites", "%" PRIu64, lost);
	worker_free(w);
	return err || lost ? 1 : 0;
}

static int run_phase(const struct config *cfg, MDB_env *env, MDB_dbi dbi)
{
	struct worker **ws = calloc(cfg->threads, sizeof(*ws));
	pthread_t *tids = calloc(cfg->threads, sizeof(*tids));
	pthread_barrier_t start;
	struct hist *total = calloc(YCSB_OP_COUNT, sizeof(*total));
	uint64_t t0, t1, ops = 0, lost = 0, bad = 0;
	uint32_t started = 0;
	int ret = 0;

	if (!ws || !tids || !total) {
		fprintf(stderr, "ycsb_lmdb: out of memory\n");
		free(ws);
		free(tids);
		free(total);
		return 1;
	}
	pthread_barrier_init(&start, NULL, cfg->threads + 1);
	for (uint32_t t = 0; t < cfg->threads; t++) {
		struct ycsb_opts o = { 0 };
		struct worker *w = worker_new(cfg, env, dbi, cfg->batch);
		int rc;

		if (!w) {
			fprintf(stderr, "ycsb_lmdb: out of memory\n");
			exit(1);
		}
		w->index = t;
		w->start = &start;
		w->ops = cfg->ops / cfg->threads + (t < cfg->ops % cfg->threads ? 1 : 0);
		o.ops = w->ops;
		o.thread = t;
		o.threads = cfg->threads;
		o.write_all_fields = (uint32_t)cfg->write_all;
		rc = ycsb_init(&w->gen, &cfg->w, cfg->records, cfg->seed, &o);
		if (rc) {
			fprintf(stderr, "ycsb_lmdb: ycsb_init: %s\n", strerror(-rc));
			exit(1);
		}
		ws[t] = w;
		rc = pthread_create(&tids[t], NULL, worker_run, w);
		if (rc) {
			fprintf(stderr, "ycsb_lmdb: pthread_create: %s\n", strerror(rc));
			exit(1);
		}
		started++;
	}
	pthread_barrier_wait(&start);
	for (uint32_t t = 0; t < started; t++)
		pthread_join(tids[t], NULL);

	/* From the first thread's start to the last one's end. */
	t0 = UINT64_MAX;
	t1 = 0;
	for (uint32_t t = 0; t < started; t++) {
		if (ws[t]->t_start < t0)
			t0 = ws[t]->t_start;
		if (ws[t]->t_end > t1)
			t1 = ws[t]->t_end;
		for (int i = 0; i < YCSB_OP_COUNT; i++) {
			hist_merge(&total[i], &ws[t]->h[i]);
			ops += ws[t]->h[i].count;
		}
		lost += ws[t]->lost;
		bad += ws[t]->bad;
		if (ws[t]->err)
			ret = 1;
	}
	emit("OVERALL", "RunTime(ms)", "%" PRIu64, (t1 - t0) / 1000000);
	emit("OVERALL", "Throughput(ops/sec)", "%.1f",
	     t1 > t0 ? (double)ops * 1e9 / (double)(t1 - t0) : 0.0);
	for (int i = 0; i < YCSB_OP_COUNT; i++)
		if (total[i].count)
			emit_hist(ycsb_op_name((uint32_t)i), &total[i]);
	if (lost) {
		emit("OVERALL", "LostWrites", "%" PRIu64, lost);
		ret = 1;
	}
	if (cfg->verify)
		emit("OVERALL", "CorruptRecords", "%" PRIu64, bad);
	if (bad)
		ret = 1;
	for (uint32_t t = 0; t < started; t++)
		worker_free(ws[t]);
	pthread_barrier_destroy(&start);
	free(ws);
	free(tids);
	free(total);
	return ret;
}

/* ---- --check: verify and dump the database ------------------------------ */

static int check_db(const struct config *cfg, MDB_env *env, MDB_dbi dbi)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	uint64_t n = 0, bad = 0;
	int rc;

	rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
	if (rc == 0) {
		rc = mdb_cursor_open(txn, dbi, &cur);
		if (rc)
			mdb_txn_abort(txn);
	}
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: --check: %s\n", mdb_strerror(rc));
		return 1;
	}
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		uint64_t keynum, ver[YCSB_FIELDS];

		n++;
		if (ycsb_record_check(k.mv_data, k.mv_size, v.mv_data, v.mv_size, &keynum, ver)) {
			bad++;
			fprintf(stderr, "ycsb_lmdb: corrupt record: key %.*s (%zu bytes)\n",
				(int)(k.mv_size < 64 ? k.mv_size : 64), (const char *)k.mv_data,
				v.mv_size);
			continue;
		}
		if (cfg->dump) {
			printf("RECORD %.*s %" PRIu64, (int)k.mv_size, (const char *)k.mv_data,
			       keynum);
			for (int f = 0; f < YCSB_FIELDS; f++)
				printf(" %" PRIu64, ver[f]);
			putchar('\n');
		}
	}
	if (rc != MDB_NOTFOUND)
		fprintf(stderr, "ycsb_lmdb: --check: %s\n", mdb_strerror(rc));
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	emit("CHECK", "Records", "%" PRIu64, n);
	emit("CHECK", "Corrupt", "%" PRIu64, bad);
	return bad || rc != MDB_NOTFOUND ? 1 : 0;
}

/* ---- main --------------------------------------------------------------- */

/* The run's settings as the first rows of the CSV file. */
static void csv_config(const struct config *cfg)
{
	emit_csv("CONFIG", "Workload", "%c", cfg->w.name);
	emit_csv("CONFIG", "Records", "%" PRIu64, cfg->records);
	emit_csv("CONFIG", "Operations", "%" PRIu64, cfg->ops);
	emit_csv("CONFIG", "Threads", "%u", cfg->threads);
	emit_csv("CONFIG", "Seed", "%" PRIu64, cfg->seed);
	emit_csv("CONFIG", "Batch", "%" PRIu64, cfg->batch);
	emit_csv("CONFIG", "Backend", "%s", cfg->pmo_keyfile ? "pmo" : "file");
}

int main(int argc, char **argv)
{
	struct config cfg;
	char key[KEY_FILE_MAX + 1] = "";
	MDB_env *env;
	MDB_dbi dbi;
	int ret = 0, rc;

	parse_args(argc, argv, &cfg);
	if (cfg.csv) {
		rc = emit_open_csv(cfg.csv);
		if (rc) {
			fprintf(stderr, "ycsb_lmdb: %s: %s\n", cfg.csv, strerror(-rc));
			return 1;
		}
		if (!cfg.check)
			csv_config(&cfg);
	}
	if (env_open(&cfg, &env, &dbi, key)) {
		env_release();
		return 1;
	}
	if (cfg.check) {
		ret = check_db(&cfg, env, dbi);
	} else {
		if (cfg.load)
			ret |= load_phase(&cfg, env, dbi);
		if (cfg.run && !ret)
			ret |= run_phase(&cfg, env, dbi);
		if (cfg.nosync)
			mdb_env_sync(env, 1);
	}
	mdb_env_close(env);
	env_release();
	rc = emit_close_csv();
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: %s: %s\n", cfg.csv, strerror(-rc));
		ret = 1;
	}
	fflush(stdout);
	return ret;
}
