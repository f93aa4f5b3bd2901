// SPDX-License-Identifier: GPL-2.0
/*
 * Prints what guest/include/uapi/virtio_pmo.h says, for tests/c_layout.rs:
 * every constant, and every wire structure filled field by field with
 * distinct values, as its size and bytes.  The Rust side decodes the bytes
 * with proto/ and compares, so any difference in a size, an offset, a
 * field's width or a constant fails the test.
 */
#include <endian.h>
#include <stdio.h>
#include <string.h>

#include "virtio_pmo.h"

static void dump(const char *name, const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;

	printf("struct %s %zu ", name, n);
	for (i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

#define CONST(x) printf("const %s %lld\n", #x, (long long)(x))
#define DUMP(s, v) dump(#s, &(v), sizeof(v))

static __le32 key(__u8 *dst, const char *k)
{
	memcpy(dst, k, strlen(k));
	return htole32(strlen(k));
}

int main(void)
{
	CONST(VIRTIO_ID_PMO);
	CONST(VIRTIO_PMO_VERSION);
	CONST(VIRTIO_PMO_NAME_FIELD);
	CONST(VIRTIO_PMO_NAME_MAX);
	CONST(VIRTIO_PMO_KEY_FIELD);
	CONST(VIRTIO_PMO_DESIGN_FIELD);
	CONST(VIRTIO_PMO_HIST_BUCKETS);
	CONST(VIRTIO_PMO_OP_CREATE);
	CONST(VIRTIO_PMO_OP_DESTROY);
	CONST(VIRTIO_PMO_OP_ATTACH);
	CONST(VIRTIO_PMO_OP_DETACH);
	CONST(VIRTIO_PMO_OP_PSYNC);
	CONST(VIRTIO_PMO_OP_STAT);
	CONST(VIRTIO_PMO_OP_SET_DESIGN);
	CONST(VIRTIO_PMO_OP_LIST);
	CONST(VIRTIO_PMO_S_OK);
	CONST(VIRTIO_PMO_S_PERM);
	CONST(VIRTIO_PMO_S_NOENT);
	CONST(VIRTIO_PMO_S_IO);
	CONST(VIRTIO_PMO_S_NOMEM);
	CONST(VIRTIO_PMO_S_ACCES);
	CONST(VIRTIO_PMO_S_BUSY);
	CONST(VIRTIO_PMO_S_EXIST);
	CONST(VIRTIO_PMO_S_INVAL);
	CONST(VIRTIO_PMO_S_NOSPC);
	CONST(VIRTIO_PMO_S_NAMETOOLONG);
	CONST(VIRTIO_PMO_S_NOSYS);
	CONST(VIRTIO_PMO_S_PROTO);
	CONST(VIRTIO_PMO_S_BADMSG);
	CONST(VIRTIO_PMO_S_STALE);
	CONST(VIRTIO_PMO_PERM_READ);
	CONST(VIRTIO_PMO_PERM_WRITE);
	CONST(VIRTIO_PMO_LIST_DETACHED);
	CONST(VIRTIO_PMO_LIST_READERS);
	CONST(VIRTIO_PMO_LIST_WRITER);
	CONST(VIRTIO_PMO_EVENT_PAGE_POISONED);
	CONST(VIRTIO_PMO_EVENT_PAGE_BAD);

	struct virtio_pmo_config cfg = {
		.version = htole32(1), .page_size = htole32(4096),
		.window_size = htole64(0x0102030405060708ULL),
		.max_name_len = htole32(63), .max_key_len = htole32(64),
		.max_pmo_size = htole64(0x1112131415161718ULL),
	};
	DUMP(virtio_pmo_config, cfg);

	struct virtio_pmo_resp_hdr rh = {
		.status = htole32(VIRTIO_PMO_S_BADMSG), .len = htole32(0x2a),
	};
	DUMP(virtio_pmo_resp_hdr, rh);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_create c;
	} __attribute__((packed)) create = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_CREATE),
		       htole32(sizeof(struct virtio_pmo_create)) },
		.c = { .name = "layout-create", .size = htole64(0x2122232425262728ULL) },
	};
	create.c.key_len = key(create.c.key, "k3y-create");
	DUMP(create, create);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_destroy d;
	} __attribute__((packed)) destroy = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_DESTROY),
		       htole32(sizeof(struct virtio_pmo_destroy)) },
		.d = { .name = "layout-destroy" },
	};
	destroy.d.key_len = key(destroy.d.key, "k3y-destroy");
	DUMP(destroy, destroy);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_attach a;
	} __attribute__((packed)) attach = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_ATTACH),
		       htole32(sizeof(struct virtio_pmo_attach)) },
		.a = { .name = "layout-attach", .perm = htole32(VIRTIO_PMO_PERM_WRITE) },
	};
	attach.a.key_len = key(attach.a.key, "k3y-attach");
	DUMP(attach, attach);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_handle x;
	} __attribute__((packed)) psync = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_PSYNC),
		       htole32(sizeof(struct virtio_pmo_handle)) },
		.x = { htole64(0x3132333435363738ULL) },
	};
	DUMP(psync, psync);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_set_design d;
	} __attribute__((packed)) design = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_SET_DESIGN),
		       htole32(sizeof(struct virtio_pmo_set_design)) },
		.d = { .name = "sp-id" },
	};
	DUMP(set_design, design);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_list l;
	} __attribute__((packed)) list = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_LIST),
		       htole32(sizeof(struct virtio_pmo_list)) },
		.l = { htole32(0x41424344) },
	};
	DUMP(list, list);

	struct virtio_pmo_attach_resp ar = {
		htole64(0x5152535455565758ULL), htole64(0x6162636465666768ULL),
		htole64(0x7172737475767778ULL),
	};
	DUMP(virtio_pmo_attach_resp, ar);

	struct virtio_pmo_psync_resp pr = { htole64(0x8182838485868788ULL) };
	DUMP(virtio_pmo_psync_resp, pr);

	/* Field i holds 0x91..00 + i, in the order proto/ decodes them. */
	struct virtio_pmo_stat st = {
		.size = htole64(0x9100000000000000ULL),
		.faults = htole64(0x9100000000000001ULL),
		.fault_ns_total = htole64(0x9100000000000002ULL),
		.pages_decrypted = htole64(0x9100000000000003ULL),
		.pages_prefetched = htole64(0x9100000000000004ULL),
		.psyncs = htole64(0x9100000000000005ULL),
		.psync_pages = htole64(0x9100000000000006ULL),
		.psync_ns_total = htole64(0x9100000000000007ULL),
		.integrity_failures = htole64(0x9100000000000008ULL),
		.triggers = htole64(0x9100000000000019ULL),
		.trigger_hits = htole64(0x910000000000001aULL),
		.trigger_wasted = htole64(0x910000000000001bULL),
		.prefetch_late = htole64(0x910000000000001cULL),
		.demand_unpredicted = htole64(0x910000000000001dULL),
		.dram_pages = htole64(0x910000000000001eULL),
		.cxl_dirty_pages = htole64(0x910000000000001fULL),
		.promotions = htole64(0x9100000000000020ULL),
		.demotions = htole64(0x9100000000000021ULL),
		.prefetch_to_cxl = htole64(0x9100000000000022ULL),
		.vm_budget_pages = htole64(0x9100000000000023ULL),
		.vm_dram_pages = htole64(0x9100000000000024ULL),
		.vm_cxl_dirty_pages = htole64(0x9100000000000025ULL),
		.vm_bytes_moved = htole64(0x9100000000000026ULL),
	};
	int i;

	for (i = 0; i < VIRTIO_PMO_HIST_BUCKETS; i++)
		st.fault_hist[i] = htole64(0x9100000000000009ULL + i);
	DUMP(virtio_pmo_stat, st);

	struct virtio_pmo_list_resp lr = {
		.name = "layout-list", .size = htole64(0xa1a2a3a4a5a6a7a8ULL),
		.attached = htole32(VIRTIO_PMO_LIST_READERS), .more = htole32(1),
	};
	DUMP(virtio_pmo_list_resp, lr);

	struct virtio_pmo_event ev = {
		.type = htole32(VIRTIO_PMO_EVENT_PAGE_BAD), .handle = htole64(0xb1b2b3b4b5b6b7b8ULL),
		.page = htole64(0xc1c2c3c4c5c6c7c8ULL),
	};
	DUMP(virtio_pmo_event, ev);
	return 0;
}
