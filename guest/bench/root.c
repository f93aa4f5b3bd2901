/*
 * root.c - validation of a pmo_bench root read from a PMO (see root.h).
 */
#include <string.h>

#include "root.h"

/* [a, a+alen) and [b, b+blen) share a byte; no overflow (both lie inside the PMO). */
static int overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

const char *root_check(const struct bench_root *r, uint64_t roff, uint64_t size,
		       struct wl_params *p)
{
	unsigned int i, j;

	if (!roff || roff % 8 || roff > size || size - roff < sizeof(*r))
		return "root outside the PMO";
	if (r->magic != ROOT_MAGIC || r->version != ROOT_VERSION)
		return "the root is not a pmo_bench run";
	memset(p, 0, sizeof(*p));
	p->kind = r->kind;
	p->n = r->n;
	p->sweeps = r->sweeps;
	p->tile = r->tile;
	if (wl_invalid(p) || r->iters != wl_iters(p) || r->next > r->iters ||
	    r->narrays != wl_narrays(p))
		return "the root's parameters are inconsistent";
	for (i = 0; i < r->narrays; i++) {
		uint64_t off = r->off[i], len = r->bytes[i];

		if (len != wl_array_bytes(p, i) || !off || off % 16 || off > size ||
		    size - off < len)
			return "an array lies outside the PMO";
		/* Arrays that overlap the root or each other would corrupt the run. */
		if (overlaps(off, len, roff, sizeof(*r)))
			return "an array overlaps the root";
		for (j = 0; j < i; j++)
			if (overlaps(off, len, r->off[j], r->bytes[j]))
				return "arrays overlap";
	}
	return NULL;
}
