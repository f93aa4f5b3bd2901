/*
 * fb_personality.c - the four personalities as Filebench's workloads/<name>.f
 * define them (flowop names and order, fileset sizes, thread counts), the
 * defaults at each scale, and the configuration check.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fb_data.h"
#include "fb_internal.h"

#define K 1024ull
#define M (1024ull * 1024ull)

static const struct fb_flowop_def fileserver_ops[] = {
	{ "createfile1", FB_OP_CREATE },
	{ "wrtfile1", FB_OP_WRITEWHOLE },
	{ "closefile1", FB_OP_CLOSE },
	{ "openfile1", FB_OP_OPEN },
	{ "appendfilerand1", FB_OP_APPENDRAND },
	{ "closefile2", FB_OP_CLOSE },
	{ "openfile2", FB_OP_OPEN },
	{ "readfile1", FB_OP_READWHOLE },
	{ "closefile3", FB_OP_CLOSE },
	{ "deletefile1", FB_OP_DELETE },
	{ "statfile1", FB_OP_STAT },
};

static const struct fb_flowop_def varmail_ops[] = {
	{ "deletefile1", FB_OP_DELETE },
	{ "createfile2", FB_OP_CREATE },
	{ "appendfilerand2", FB_OP_APPENDRAND },
	{ "fsyncfile2", FB_OP_FSYNC },
	{ "closefile2", FB_OP_CLOSE },
	{ "openfile3", FB_OP_OPEN },
	{ "readfile3", FB_OP_READWHOLE },
	{ "appendfilerand3", FB_OP_APPENDRAND },
	{ "fsyncfile3", FB_OP_FSYNC },
	{ "closefile3", FB_OP_CLOSE },
	{ "openfile4", FB_OP_OPEN },
	{ "readfile4", FB_OP_READWHOLE },
	{ "closefile4", FB_OP_CLOSE },
};

/* Filebench's list ends with "opslimit", a no-op without an event generator: left out. */
static const struct fb_flowop_def webproxy_ops[] = {
	{ "deletefile1", FB_OP_DELETE },
	{ "createfile1", FB_OP_CREATE },
	{ "appendfilerand1", FB_OP_APPENDRAND },
	{ "closefile1", FB_OP_CLOSE },
	{ "openfile2", FB_OP_OPEN },
	{ "readfile2", FB_OP_READWHOLE },
	{ "closefile2", FB_OP_CLOSE },
	{ "openfile3", FB_OP_OPEN },
	{ "readfile3", FB_OP_READWHOLE },
	{ "closefile3", FB_OP_CLOSE },
	{ "openfile4", FB_OP_OPEN },
	{ "readfile4", FB_OP_READWHOLE },
	{ "closefile4", FB_OP_CLOSE },
	{ "openfile5", FB_OP_OPEN },
	{ "readfile5", FB_OP_READWHOLE },
	{ "closefile5", FB_OP_CLOSE },
	{ "openfile6", FB_OP_OPEN },
	{ "readfile6", FB_OP_READWHOLE },
	{ "closefile6", FB_OP_CLOSE },
};

static const struct fb_flowop_def webserver_ops[] = {
	{ "openfile1", FB_OP_OPEN },
	{ "readfile1", FB_OP_READWHOLE },
	{ "closefile1", FB_OP_CLOSE },
	{ "openfile2", FB_OP_OPEN },
	{ "readfile2", FB_OP_READWHOLE },
	{ "closefile2", FB_OP_CLOSE },
	{ "openfile3", FB_OP_OPEN },
	{ "readfile3", FB_OP_READWHOLE },
	{ "closefile3", FB_OP_CLOSE },
	{ "openfile4", FB_OP_OPEN },
	{ "readfile4", FB_OP_READWHOLE },
	{ "closefile4", FB_OP_CLOSE },
	{ "openfile5", FB_OP_OPEN },
	{ "readfile5", FB_OP_READWHOLE },
	{ "closefile5", FB_OP_CLOSE },
	{ "openfile6", FB_OP_OPEN },
	{ "readfile6", FB_OP_READWHOLE },
	{ "closefile6", FB_OP_CLOSE },
	{ "openfile7", FB_OP_OPEN },
	{ "readfile7", FB_OP_READWHOLE },
	{ "closefile7", FB_OP_CLOSE },
	{ "openfile8", FB_OP_OPEN },
	{ "readfile8", FB_OP_READWHOLE },
	{ "closefile8", FB_OP_CLOSE },
	{ "openfile9", FB_OP_OPEN },
	{ "readfile9", FB_OP_READWHOLE },
	{ "closefile9", FB_OP_CLOSE },
	{ "openfile10", FB_OP_OPEN },
	{ "readfile10", FB_OP_READWHOLE },
	{ "closefile10", FB_OP_CLOSE },
	{ "appendlog", FB_OP_APPENDLOG },
};

#define N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

static const struct fb_personality_def defs[FB_NPERSONALITIES] = {
	[FB_FILESERVER] = { "fileserver", 10000, 50, 80, 128 * K, 1 * M, 16 * K, 0,
			    N(fileserver_ops), fileserver_ops },
	[FB_VARMAIL] = { "varmail", 1000, 16, 80, 16 * K, 1 * M, 16 * K, 0,
			 N(varmail_ops), varmail_ops },
	[FB_WEBPROXY] = { "webproxy", 10000, 100, 80, 16 * K, 1 * M, 16 * K, 0,
			  N(webproxy_ops), webproxy_ops },
	[FB_WEBSERVER] = { "webserver", 1000, 100, 100, 16 * K, 1 * M, 16 * K, 1,
			   N(webserver_ops), webserver_ops },
};

const struct fb_personality_def *fb_personality_def(uint32_t p)
{
	return p < FB_NPERSONALITIES ? &defs[p] : NULL;
}

int fb_personality_by_name(const char *name)
{
	for (uint32_t p = 0; p < FB_NPERSONALITIES; p++)
		if (strcmp(name, defs[p].name) == 0)
			return (int)p;
	return -1;
}

const char *fb_personality_name(uint32_t p)
{
	return p < FB_NPERSONALITIES ? defs[p].name : NULL;
}

uint32_t fb_op_kind(uint32_t op)
{
	switch (op) {
	case FB_OP_READWHOLE:
		return FB_KIND_READ;
	case FB_OP_WRITEWHOLE:
	case FB_OP_APPENDRAND:
	case FB_OP_APPENDLOG:
		return FB_KIND_WRITE;
	default:
		return FB_KIND_OTHER;
	}
}

int fb_open_writable(const struct fb_personality_def *def, uint32_t i)
{
	for (uint32_t j = i + 1; j < def->nflowops; j++) {
		uint32_t op = def->flowops[j].op;

		if (op == FB_OP_CLOSE)
			return 0;
		if (op == FB_OP_WRITEWHOLE || op == FB_OP_APPENDRAND || op == FB_OP_FSYNC)
			return 1;
	}
	return 0;
}

int fb_write_share(uint32_t p, uint32_t *writes, uint32_t *ios)
{
	const struct fb_personality_def *def = fb_personality_def(p);

	if (!def)
		return EINVAL;
	*writes = 0;
	*ios = 0;
	for (uint32_t i = 0; i < def->nflowops; i++) {
		uint32_t k = fb_op_kind(def->flowops[i].op);

		*writes += k == FB_KIND_WRITE;
		*ios += k != FB_KIND_OTHER;
	}
	return 0;
}

uint32_t fb_loop_len(uint32_t p)
{
	const struct fb_personality_def *def = fb_personality_def(p);

	return def ? def->nflowops : 0;
}

/* @x rounded up to whole pages. */
static uint64_t page_up(uint64_t x)
{
	return (x + FB_PAGE - 1) / FB_PAGE * FB_PAGE;
}

uint64_t fb_default_file_cap(uint64_t meanfilesize, uint64_t appendsize)
{
	return page_up(FB_HDR_SIZE + 4 * meanfilesize + 2 * appendsize);
}

int fb_config_init(struct fb_config *cfg, uint32_t p, uint32_t scale)
{
	const struct fb_personality_def *def = fb_personality_def(p);

	if (!def || (scale != FB_SCALE_FULL && scale != FB_SCALE_SMALL))
		return EINVAL;
	memset(cfg, 0, sizeof(*cfg));
	cfg->personality = p;
	cfg->nfiles = def->nfiles;
	cfg->nthreads = def->nthreads;
	cfg->prealloc_pct = def->prealloc_pct;
	cfg->ops = 0;
	cfg->seconds = 60;
	if (scale == FB_SCALE_SMALL) {
		cfg->nfiles = def->nfiles / 10;
		cfg->nthreads = 4;
		cfg->ops = 5000;
	}
	cfg->seed = 1;
	cfg->meanfilesize = def->meanfilesize;
	cfg->sizegamma_milli = 1500;
	cfg->iosize = def->iosize;
	cfg->appendsize = def->appendsize;
	cfg->file_cap = fb_default_file_cap(cfg->meanfilesize, cfg->appendsize);
	cfg->log_cap = def->has_log ? 8 * M : 0;
	snprintf(cfg->prefix, sizeof(cfg->prefix), "fb.%s", def->name);
	return 0;
}

/* Name characters libpmo accepts: [A-Za-z0-9._-], not starting with '.'. */
static int prefix_ok(const char *s)
{
	size_t n = strnlen(s, FB_PREFIX_MAX + 1);

	if (n == 0 || n > FB_PREFIX_MAX || s[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

int fb_config_check(const struct fb_config *cfg, char *err, size_t errlen)
{
	const struct fb_personality_def *def = fb_personality_def(cfg->personality);
	const char *why = NULL;

	if (!def)
		why = "unknown personality";
	else if (cfg->nfiles == 0 || cfg->nfiles > 10000000)
		why = "nfiles must be 1..10000000";
	else if (cfg->nthreads == 0 || cfg->nthreads > 256)
		why = "nthreads must be 1..256";
	else if (cfg->prealloc_pct > 100)
		why = "prealloc_pct must be 0..100";
	else if (cfg->ops == 0 && cfg->seconds == 0)
		why = "ops or seconds must be non-zero";
	else if (cfg->iosize == 0 || cfg->iosize > 1024 * M)
		why = "iosize must be 1..1G";
	else if (cfg->appendsize == 0 || cfg->appendsize > 1024 * M)
		why = "appendsize must be 1..1G";
	else if (cfg->file_cap <= FB_HDR_SIZE || cfg->file_cap % FB_PAGE)
		why = "file_cap must be a positive multiple of 4096";
	else if (def->has_log && (cfg->log_cap <= FB_HDR_SIZE || cfg->log_cap % FB_PAGE))
		why = "log_cap must be a positive multiple of 4096";
	else if (!prefix_ok(cfg->prefix))
		why = "prefix must be 1..47 of [A-Za-z0-9._-], not starting with '.'";
	if (why) {
		if (err && errlen)
			snprintf(err, errlen, "%s", why);
		return EINVAL;
	}
	return 0;
}
