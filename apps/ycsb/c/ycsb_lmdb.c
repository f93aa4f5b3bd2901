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
 * Files: this one runs the workload on LMDB (workers, load and run phases,
 * --check, opening the environment and its PMO backend) and holds main();
 * ycsb_cli.c parses the command line into struct config (ycsb_config.h);
 * ycsb_report.c keeps the latency histograms and prints the output lines;
 * ycsb.c is the workload generator.  This file stays whole past 600 lines:
 * it is one concern, running the workload against one LMDB environment.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lmdb.h"
#include "ycsb.h"
#include "ycsb_cli.h"
#include "ycsb_config.h"
#include "ycsb_report.h"

#ifdef YCSB_WITH_PMO
#include "pmo_libpmo.h"
#endif

/* ---- one worker: its generator, txns and pending commits ---------------- */

struct pending {
	uint32_t type, field;
	uint64_t keynum, version;
	char key[YCSB_KEY_MAX];
};

struct worker {
	const struct config *cfg;
	MDB_env *env;
	MDB_dbi dbi;
	pthread_barrier_t *start;
	uint32_t index;
	int loading;		/* the load phase's worker: commits log as "LOAD" */
	uint64_t ops;
	struct ycsb gen;
	struct ycsb_op op;
	MDB_txn *rtxn;		/* reset between reads */
	MDB_txn *wtxn;		/* open write txn, or NULL */
	struct pending *pend;	/* writes of wtxn, cfg->batch of them at most */
	uint64_t npend, batch;
	uint64_t lost;		/* writes dropped by failed commits/aborts */
	uint64_t bad;		/* records that failed --verify */
	uint64_t t_start, t_end;	/* the run phase of this thread */
	uint8_t rec[YCSB_RECORD_LEN];
	struct hist h[YCSB_OP_COUNT];
	int err;		/* first fatal LMDB error */
};

static void lmdb_warn(const struct worker *w, const char *what, int rc)
{
	fprintf(stderr, "ycsb_lmdb: thread %u: %s: %s\n", w->index, what, mdb_strerror(rc));
}

static void log_commits(struct worker *w)
{
	if (!w->cfg->log_commits || w->npend == 0)
		return;
	flockfile(stdout);
	for (uint64_t i = 0; i < w->npend; i++) {
		const struct pending *p = &w->pend[i];
		const char *op = w->loading ? "LOAD" : ycsb_op_name(p->type);

		if (p->field == YCSB_ALL_FIELDS)
			printf("COMMIT %s %s %" PRIu64 " %" PRIu64 " all\n", op, p->key, p->keynum,
			       p->version);
		else
			printf("COMMIT %s %s %" PRIu64 " %" PRIu64 " %u\n", op, p->key, p->keynum,
			       p->version, p->field);
	}
	fflush(stdout);
	funlockfile(stdout);
}

static int commit(struct worker *w)
{
	int rc;

	if (!w->wtxn)
		return 0;
	rc = mdb_txn_commit(w->wtxn);
	w->wtxn = NULL;
	if (rc) {
		lmdb_warn(w, "mdb_txn_commit", rc);
		w->lost += w->npend;
		w->npend = 0;
		return rc;
	}
	log_commits(w);
	w->npend = 0;
	return 0;
}

static void abort_writes(struct worker *w)
{
	if (w->wtxn)
		mdb_txn_abort(w->wtxn);
	w->wtxn = NULL;
	w->lost += w->npend;
	w->npend = 0;
}

static int begin_write(struct worker *w)
{
	int rc;

	if (w->wtxn)
		return 0;
	rc = mdb_txn_begin(w->env, NULL, 0, &w->wtxn);
	if (rc) {
		w->wtxn = NULL;
		lmdb_warn(w, "mdb_txn_begin", rc);
	}
	return rc;
}

/* A txn to read in: the open write txn, else the renewed read-only one. */
static int begin_read(struct worker *w, MDB_txn **txn)
{
	int rc;

	if (w->wtxn) {
		*txn = w->wtxn;
		return 0;
	}
	rc = w->rtxn ? mdb_txn_renew(w->rtxn) : mdb_txn_begin(w->env, NULL, MDB_RDONLY, &w->rtxn);
	if (rc) {
		lmdb_warn(w, "read txn", rc);
		return rc;
	}
	*txn = w->rtxn;
	return 0;
}

static void end_read(struct worker *w, MDB_txn *txn)
{
	if (txn == w->rtxn)
		mdb_txn_reset(w->rtxn);
}

/* Copy the record of @key into w->rec; ST_OK, ST_NOT_FOUND or ST_ERROR. */
static enum status get_record(struct worker *w, MDB_txn *txn, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v;
	int rc = mdb_get(txn, w->dbi, &k, &v);

	if (rc == MDB_NOTFOUND)
		return ST_NOT_FOUND;
	if (rc) {
		lmdb_warn(w, "mdb_get", rc);
		return ST_ERROR;
	}
	if (v.mv_size != YCSB_RECORD_LEN) {
		w->bad++;
		return ST_ERROR;
	}
	memcpy(w->rec, v.mv_data, YCSB_RECORD_LEN);
	if (w->cfg->verify &&
	    ycsb_record_check(op->key, op->key_len, w->rec, YCSB_RECORD_LEN, NULL, NULL)) {
		w->bad++;
		return ST_ERROR;
	}
	return ST_OK;
}

static enum status do_read(struct worker *w, const struct ycsb_op *op)
{
	MDB_txn *txn;
	enum status st;

	if (begin_read(w, &txn))
		return ST_ERROR;
	st = get_record(w, txn, op);
	end_read(w, txn);
	return st;
}

static enum status do_scan(struct worker *w, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v;
	MDB_cursor *cur;
	MDB_txn *txn;
	enum status st = ST_OK;
	int rc;

	if (begin_read(w, &txn))
		return ST_ERROR;
	rc = mdb_cursor_open(txn, w->dbi, &cur);
	if (rc) {
		lmdb_warn(w, "mdb_cursor_open", rc);
		end_read(w, txn);
		return ST_ERROR;
	}
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	for (uint32_t n = 0; rc == 0 && n < op->scan_len; n++) {
		if (v.mv_size != YCSB_RECORD_LEN) {
			w->bad++;
			st = ST_ERROR;
			break;
		}
		memcpy(w->rec, v.mv_data, YCSB_RECORD_LEN);
		if (w->cfg->verify &&
		    ycsb_record_check(k.mv_data, k.mv_size, w->rec, YCSB_RECORD_LEN, NULL, NULL)) {
			w->bad++;
			st = ST_ERROR;
			break;
		}
		if (n + 1 < op->scan_len)
			rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
	}
	if (rc && rc != MDB_NOTFOUND) {
		lmdb_warn(w, "mdb_cursor_get", rc);
		st = ST_ERROR;
	}
	mdb_cursor_close(cur);
	end_read(w, txn);
	return st;
}

/* Remember a write of the open txn for --log-commits. */
static void add_pending(struct worker *w, const struct ycsb_op *op)
{
	struct pending *p = &w->pend[w->npend++];

	p->type = op->type;
	p->field = op->field;
	p->keynum = op->keynum;
	p->version = op->version;
	memcpy(p->key, op->key, sizeof(p->key));
}

/* UPDATE, INSERT, RMW (and the load phase's inserts) in the write txn. */
static enum status do_write(struct worker *w, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v = { YCSB_RECORD_LEN, NULL };
	enum status st;
	int rc;

	if (begin_write(w))
		return ST_ERROR;
	if (op->type == YCSB_OP_INSERT) {
		v.mv_data = (void *)op->values;
	} else {
		st = get_record(w, w->wtxn, op);
		if (st != ST_OK) {
			/*
			 * Nothing written: do not keep LMDB's writer lock for an
			 * empty txn (a failed mdb_get may also have spoiled it).
			 */
			if (w->npend == 0 || st == ST_ERROR)
				abort_writes(w);
			return st;
		}
		if (op->field == YCSB_ALL_FIELDS)
			memcpy(w->rec, op->values, YCSB_RECORD_LEN);
		else
			memcpy(w->rec + (size_t)op->field * YCSB_FIELD_LEN, op->values[op->field],
			       YCSB_FIELD_LEN);
		v.mv_data = w->rec;
	}
	rc = mdb_put(w->wtxn, w->dbi, &k, &v, 0);
	if (rc) {
		lmdb_warn(w, "mdb_put", rc);
		abort_writes(w);
		if (!w->err)
			w->err = rc;
		return ST_ERROR;
	}
	add_pending(w, op);
	if (w->npend >= w->batch && commit(w)) {
		if (!w->err)
			w->err = EIO;
		return ST_ERROR;
	}
	return ST_OK;
}

static enum status do_op(struct worker *w, const struct ycsb_op *op)
{
	switch (op->type) {
	case YCSB_OP_READ:
		return do_read(w, op);
	case YCSB_OP_SCAN:
		return do_scan(w, op);
	default:
		return do_write(w, op);
	}
}

static void *run_worker(void *arg)
{
	struct worker *w = arg;

	pthread_barrier_wait(w->start);
	w->t_start = now_ns();
	for (uint64_t i = 0; i < w->ops && !w->err; i++) {
		uint64_t t0, t1;
		enum status st;

		ycsb_next_op(&w->gen, &w->op);
		t0 = now_ns();
		st = do_op(w, &w->op);
		t1 = now_ns();
		hist_add(&w->h[w->op.type], t1 - t0, st);
	}
	if (commit(w) && !w->err)
		w->err = EIO;
	if (w->rtxn)
		mdb_txn_abort(w->rtxn);
	w->rtxn = NULL;
	w->t_end = now_ns();
	return NULL;
}

/* ---- phases ------------------------------------------------------------- */

static struct worker *new_worker(const struct config *cfg, MDB_env *env, MDB_dbi dbi,
				 uint64_t batch)
{
	struct worker *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->pend = calloc(batch, sizeof(*w->pend));
	if (!w->pend) {
		free(w);
		return NULL;
	}
	w->cfg = cfg;
	w->env = env;
	w->dbi = dbi;
	w->batch = batch;
	return w;
}

static void free_worker(struct worker *w)
{
	if (w)
		free(w->pend);
	free(w);
}

static int load_phase(const struct config *cfg, MDB_env *env, MDB_dbi dbi)
{
	struct worker *w = new_worker(cfg, env, dbi, cfg->load_batch);
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
		st = do_write(w, &w->op);
		hist_add(&w->h[YCSB_OP_INSERT], now_ns() - s, st);
	}
	if (commit(w) && !w->err)
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
	free_worker(w);
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
		struct worker *w = new_worker(cfg, env, dbi, cfg->batch);
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
		rc = pthread_create(&tids[t], NULL, run_worker, w);
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
		free_worker(ws[t]);
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

/* ---- the environment: plain files or a PMO ------------------------------ */

#ifdef YCSB_WITH_PMO
/* The libpmo backend; it holds a copy of the key until pmo_release(). */
static MDB_pmo_ops pmo_ops;
static int pmo_ready;
#endif

/* After the last mdb_env_close(): wipe the backend's key copy. */
static void pmo_release(void)
{
#ifdef YCSB_WITH_PMO
	if (pmo_ready)
		mdb_pmo_libpmo_free(&pmo_ops);
	pmo_ready = 0;
#endif
}

static int open_env(const struct config *cfg, MDB_env **envp, MDB_dbi *dbi,
		    char key[KEY_FILE_MAX + 1])
{
	MDB_env *env;
	MDB_txn *txn;
	unsigned int flags = MDB_NOTLS | (cfg->nosync ? MDB_NOSYNC : 0);
	int rc;

	(void)key;
	rc = mdb_env_create(&env);
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: mdb_env_create: %s\n", mdb_strerror(rc));
		return 1;
	}
	rc = mdb_env_set_mapsize(env, (size_t)cfg->map_size);
	if (!rc)
		rc = mdb_env_set_maxreaders(env, cfg->threads + 2);
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: mdb_env_set: %s\n", mdb_strerror(rc));
		mdb_env_close(env);
		return 1;
	}
	if (cfg->pmo_keyfile) {
#ifdef YCSB_WITH_PMO
		if (read_key(cfg->pmo_keyfile, key)) {
			mdb_env_close(env);
			return 1;
		}
		rc = mdb_pmo_libpmo(&pmo_ops, key);
		memset(key, 0, KEY_FILE_MAX + 1);
		if (!rc) {
			pmo_ready = 1;
			rc = mdb_env_set_pmo(env, &pmo_ops);
		}
		if (rc) {
			fprintf(stderr, "ycsb_lmdb: PMO backend: %s\n", mdb_strerror(rc));
			mdb_env_close(env);
			return 1;
		}
#else
		fprintf(stderr, "ycsb_lmdb: built without PMO support (make host): use --file\n");
		mdb_env_close(env);
		return 1;
#endif
	}
	if (mkdir(cfg->dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "ycsb_lmdb: mkdir %s: %s\n", cfg->dir, strerror(errno));
		mdb_env_close(env);
		return 1;
	}
	rc = mdb_env_open(env, cfg->dir, flags, 0644);
	if (!rc) {
		rc = mdb_txn_begin(env, NULL, 0, &txn);
		if (!rc) {
			rc = mdb_dbi_open(txn, NULL, 0, dbi);
			if (rc)
				mdb_txn_abort(txn);
			else
				rc = mdb_txn_commit(txn);
		}
	}
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: open %s: %s\n", cfg->dir, mdb_strerror(rc));
		mdb_env_close(env);
		return 1;
	}
	*envp = env;
	return 0;
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
	if (open_env(&cfg, &env, &dbi, key)) {
		pmo_release();
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
	pmo_release();
	rc = emit_close_csv();
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: %s: %s\n", cfg.csv, strerror(-rc));
		ret = 1;
	}
	fflush(stdout);
	return ret;
}
