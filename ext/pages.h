/* The pages a write will change, checked before LMDB changes them.
 *
 * LMDB trusts the pages it changes. A damaged bound of a page's free space, or
 * a node offset or size, makes it copy or move bytes past the buffer it
 * allocated for its copy of the page: the process's heap is corrupted and the
 * process aborts later, far from the cause, where the fault guard cannot turn
 * it into an error. So before each put or delete, the path that write takes
 * through the file's own pages (the sub-database's tree as its transaction
 * began, and the tree of the key's duplicates) is checked: each page where it
 * lies (its number), its kind, its bounds and every node in it; the overflow
 * pages of the value it replaces; for a delete, the neighbours LMDB may merge
 * the emptied page with. A page that fails is MDB_CORRUPTED before LMDB
 * touches it. Pages the transaction has copied already are LMDB's own.
 *
 * What is read is LMDB's on-disk format (the same since 0.9.0): a page is a
 * 16-byte header (number, pad or key size, flags, lower and upper bound of
 * the free space), 2-byte node offsets, and nodes of an 8-byte header (data
 * size, or a child's page number, in two halves; flags; key size), key, data.
 * A sub-database's record (in the main database, under its name) is 48 bytes
 * with its root's page number last. Names are noted as sub-databases open. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <lmdb.h>

#define PAGE_HEADER 16
#define NODE_HEADER 8
#define PAGE_BRANCH 0x01
#define PAGE_LEAF 0x02
#define PAGE_OVERFLOW 0x04
#define PAGE_META 0x08
#define PAGE_DIRTY 0x10
#define PAGE_LEAF2 0x20
#define NODE_BIGDATA 0x01
#define NODE_SUBDATA 0x02
#define NODE_DUPDATA 0x04
#define TREE_RECORD 48
#define TREE_ROOT 40
#define NO_PAGE UINT64_MAX
#define PAGE_MEMO 512
#define TREE_LEVELS 32   /* LMDB's deepest tree (its cursors' stack) */
#define FIRST 1
#define LAST 2
#define FREE_ROOT 80     /* in a meta page: the free-page tree's root, */
#define MAIN_ROOT 128    /* the main tree's, */
#define META_TXNID 144   /* the transaction that wrote it */

typedef struct {
    const char *map;   /* where the data file is mapped (NULL: unknown, nothing is checked) */
    size_t map_size, page_size;
    uint64_t pages;    /* the pages the file had as the transaction began */
    MDB_dbi main;
    char **names;      /* each open sub-database's name, by handle */
    size_t n_names;
    MDB_txn *txn;      /* the write transaction the memo is of */
    size_t txnid;
    uint64_t memo[PAGE_MEMO];  /* 1 + the numbers of pages found sound in it */
} PageMap;

static uint16_t at16(const char *p) { uint16_t x; memcpy(&x, p, 2); return x; }
static uint64_t at64(const char *p) { uint64_t x; memcpy(&x, p, 8); return x; }

static const char *page_at(const PageMap *m, uint64_t pgno) {
    return m->map + pgno * m->page_size;
}

/* A node's size in its page: header, key, and data (a page number where the
 * data is on overflow pages); a branch node has no data. */
static size_t node_size(const char *node, int branch) {
    size_t size = NODE_HEADER + at16(node + 6);
    if (branch)
        return size;
    return size + (at16(node + 4) & NODE_BIGDATA ? 8 : at16(node) | (size_t)at16(node + 2) << 16);
}

/* Whether the `size` bytes at `page` (a page, or a page of duplicates inside
 * a node) hold sound bounds and nodes. */
static int nodes_sound(const char *page, size_t size, int branch) {
    uint16_t flags = at16(page + 10), lower = at16(page + 12), upper = at16(page + 14);
    size_t n, i, at;
    if (lower < PAGE_HEADER || (lower & 1) || lower > upper || upper > size)
        return 0;
    n = (lower - PAGE_HEADER) / 2;
    if (flags & PAGE_LEAF2)  /* keys of one size, packed after the header */
        return !branch && PAGE_HEADER + n * at16(page + 8) <= size;
    if (branch && n == 0)
        return 0;
    for (i = 0; i < n; i++) {
        at = at16(page + PAGE_HEADER + 2 * i);
        if (at < upper || at > size - NODE_HEADER || node_size(page + at, branch) > size - at)
            return 0;
    }
    return 1;
}

/* Whether page `pgno` is a sound branch (`branch`) or leaf page. */
static int page_sound(PageMap *m, uint64_t pgno, int branch) {
    const char *page;
    uint16_t flags;
    uint64_t *memo = &m->memo[pgno % PAGE_MEMO];
    if (*memo == pgno + 1)
        return 1;
    if (pgno < 2 || pgno >= m->pages)
        return 0;
    page = page_at(m, pgno);
    flags = at16(page + 10);
    if (at64(page) != pgno || (flags & (PAGE_OVERFLOW | PAGE_META))
            || !(flags & (branch ? PAGE_BRANCH : PAGE_LEAF)) || (flags & (branch ? PAGE_LEAF : PAGE_BRANCH))
            || !nodes_sound(page, m->page_size, branch))
        return 0;
    *memo = pgno + 1;
    return 1;
}

/* Whether the overflow pages of a value of `size` bytes start at `pgno`, at
 * least as many as it takes (a value written again in place may take fewer). */
static int overflow_sound(const PageMap *m, uint64_t pgno, size_t size) {
    const char *page;
    uint64_t count = (PAGE_HEADER - 1 + size) / m->page_size + 1;
    if (pgno < 2 || pgno >= m->pages || count > m->pages - pgno)
        return 0;
    page = page_at(m, pgno);
    return at64(page) == pgno && (at16(page + 10) & ~PAGE_DIRTY) == PAGE_OVERFLOW
           && (at16(page + 12) | (uint64_t)at16(page + 14) << 16) >= count;
}

/* LMDB's default order: bytes, then length. */
static int key_order(const MDB_val *a, const char *key, size_t size) {
    int c = memcmp(a->mv_data, key, a->mv_size < size ? a->mv_size : size);
    return c ? c : (a->mv_size > size) - (a->mv_size < size);
}

static const char *node_at(const char *page, size_t i) {
    return page + at16(page + PAGE_HEADER + 2 * i);
}

/* The child LMDB goes to for `key`: the last whose first key is not above it
 * (the first child's key is not compared). */
static size_t child_for(const char *page, const MDB_val *key) {
    size_t low = 1, high = (at16(page + 12) - PAGE_HEADER) / 2, mid;
    const char *node;
    while (low < high) {  /* the first node above key, in [1, high] */
        mid = (low + high) / 2;
        node = node_at(page, mid);
        if (key_order(key, node + NODE_HEADER, at16(node + 6)) < 0)
            high = mid;
        else
            low = mid + 1;
    }
    return low - 1;
}

static uint64_t child_page(const char *node) {
    return at16(node) | (uint64_t)at16(node + 2) << 16 | (uint64_t)at16(node + 4) << 32;
}

/* The node of `key` in a leaf page, or NULL. */
static const char *leaf_node(const char *page, const MDB_val *key) {
    size_t low = 0, high = (at16(page + 12) - PAGE_HEADER) / 2, mid;
    const char *node;
    int c;
    while (low < high) {
        mid = (low + high) / 2;
        node = node_at(page, mid);
        c = key_order(key, node + NODE_HEADER, at16(node + 6));
        if (c == 0)
            return node;
        if (c < 0)
            high = mid;
        else
            low = mid + 1;
    }
    return NULL;
}

/* Whether the path to `key` in the tree at `root` is sound (and, for a
 * removal, each page's neighbours); `data`: the duplicate a put or delete of
 * a sub-database with duplicates changes, whose own tree is checked too.
 * `key` NULL: the path to the tree's FIRST or LAST leaf. */
static int tree_sound(PageMap *m, uint64_t root, const MDB_val *key, const MDB_val *data,
                      int removal, int edge) {
    uint64_t pgno = root;
    const char *page, *node;
    size_t i, n, size, levels = 0;
    uint16_t flags;
    if (root == NO_PAGE)
        return 1;
    if (pgno >= m->pages)
        return 0;
    while (at16(page_at(m, pgno) + 10) & PAGE_BRANCH) {
        if (!page_sound(m, pgno, 1) || ++levels > TREE_LEVELS)
            return 0;
        page = page_at(m, pgno);
        n = (at16(page + 12) - PAGE_HEADER) / 2;
        i = key ? child_for(page, key) : edge == LAST ? n - 1 : 0;
        pgno = child_page(node_at(page, i));
        if (pgno >= m->pages)
            return 0;
        if (removal) {  /* a page emptied below half is merged with one of these */
            flags = at16(page_at(m, pgno) + 10) & PAGE_BRANCH;
            if ((i > 0 && !page_sound(m, child_page(node_at(page, i - 1)), flags))
                    || (i + 1 < n && !page_sound(m, child_page(node_at(page, i + 1)), flags)))
                return 0;
        }
    }
    if (!page_sound(m, pgno, 0))
        return 0;
    page = page_at(m, pgno);
    if (key == NULL || (at16(page + 10) & PAGE_LEAF2) || (node = leaf_node(page, key)) == NULL)
        return 1;
    flags = at16(node + 4);
    size = at16(node) | (size_t)at16(node + 2) << 16;
    if (flags & NODE_BIGDATA)
        return overflow_sound(m, at64(node + NODE_HEADER + at16(node + 6)), size);
    if (!(flags & NODE_DUPDATA) || data == NULL)
        return 1;
    node += NODE_HEADER + at16(node + 6);
    if (flags & NODE_SUBDATA)
        return size == TREE_RECORD && tree_sound(m, at64(node + TREE_ROOT), data, NULL, removal, 0);
    return size >= PAGE_HEADER && nodes_sound(node, size, 0);  /* the duplicates in the node */
}

/* Start the memo for write transaction `t` (nothing where it is the memo's). */
static int page_map_begin(PageMap *m, MDB_txn *t) {
    MDB_envinfo info;
    int rc;
    if (m->txn == t && m->txnid == mdb_txn_id(t))
        return 0;
    if ((rc = mdb_env_info(mdb_txn_env(t), &info)) != 0)
        return rc;
    memset(m->memo, 0, sizeof m->memo);
    m->txn = t;
    m->txnid = mdb_txn_id(t);
    m->pages = info.me_last_pgno + 1;
    if (m->pages > m->map_size / m->page_size)
        m->pages = m->map_size / m->page_size;
    return 0;
}

/* Whether a put (`removal` 0) or delete of `key` (and `data`, for a
 * sub-database with duplicates) in sub-database `d` may go ahead: 0, or
 * MDB_CORRUPTED, or the error of reading where its tree is. */
static int write_sound(MDB_txn *t, MDB_dbi d, const MDB_val *key, const MDB_val *data,
                       int removal) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    MDB_val name, record;
    int rc;
    if (m == NULL || m->map == NULL || d >= m->n_names || m->names[d] == NULL)
        return 0;
    if ((rc = page_map_begin(m, t)) != 0)
        return rc;
    name.mv_data = m->names[d];
    name.mv_size = strlen(m->names[d]);
    rc = mdb_get(t, m->main, &name, &record);
    if (rc == MDB_NOTFOUND)  /* made in this transaction: every page is its own */
        return 0;
    if (rc)
        return rc;
    if (record.mv_size != TREE_RECORD)
        return MDB_CORRUPTED;
    return tree_sound(m, at64((const char *)record.mv_data + TREE_ROOT), key, data, removal, 0)
           ? 0 : MDB_CORRUPTED;
}

/* Whether every page of the tree at `pgno` is sound, `levels` deep at most. */
static int whole_tree_sound(PageMap *m, uint64_t pgno, int levels) {
    const char *page;
    size_t i, n;
    int branch;
    if (pgno == NO_PAGE)
        return 1;
    if (pgno >= m->pages || levels == 0)
        return 0;
    branch = at16(page_at(m, pgno) + 10) & PAGE_BRANCH;
    if (!page_sound(m, pgno, branch))
        return 0;
    page = page_at(m, pgno);
    n = (at16(page + 12) - PAGE_HEADER) / 2;
    for (i = 0; branch && i < n; i++)
        if (!whole_tree_sound(m, child_page(node_at(page, i)), levels - 1))
            return 0;
    return 1;
}

/* Whether the commit of write transaction `t` may go ahead: LMDB then writes
 * each changed sub-database's record into the main database (a few pages:
 * all are checked), takes the free-page records it reused from the start of
 * its free-page tree and adds one at the end (those paths are checked). The
 * two trees' roots are in the newer meta page (MDB_meta after the page
 * header: magic, version, address, map size, then the free-page and main
 * trees' records, the last page number and the transaction id). */
static int commit_sound(MDB_txn *t) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    MDB_envinfo info;
    const char *meta;
    int rc;
    if (m == NULL || m->map == NULL)
        return 0;
    if ((rc = mdb_env_info(mdb_txn_env(t), &info)) != 0)
        return rc;
    if (mdb_txn_id(t) <= info.me_last_txnid)  /* a read */
        return 0;
    if ((rc = page_map_begin(m, t)) != 0)
        return rc;
    meta = at64(m->map + META_TXNID) >= at64(m->map + m->page_size + META_TXNID)
           ? m->map : m->map + m->page_size;
    return tree_sound(m, at64(meta + FREE_ROOT), NULL, NULL, 1, FIRST)
           && tree_sound(m, at64(meta + FREE_ROOT), NULL, NULL, 0, LAST)
           && whole_tree_sound(m, at64(meta + MAIN_ROOT), TREE_LEVELS) ? 0 : MDB_CORRUPTED;
}

/* Note the name of sub-database `d` (`name` NULL: the main one, not checked). */
static int page_map_name(MDB_env *env, MDB_dbi d, const char *name) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(env);
    char **grown;
    size_t n;
    if (m == NULL)
        return 0;
    if (name == NULL)
        return 0;
    if (d >= m->n_names) {
        n = d + 16;
        if ((grown = (char **)realloc(m->names, n * sizeof *grown)) == NULL)
            return ENOMEM;
        memset(grown + m->n_names, 0, (n - m->n_names) * sizeof *grown);
        m->names = grown;
        m->n_names = n;
    }
    if (m->names[d] == NULL || strcmp(m->names[d], name) != 0) {
        free(m->names[d]);
        if ((m->names[d] = strdup(name)) == NULL)
            return ENOMEM;
    }
    return 0;
}

/* Find where the map of `env` lies: its main database's first key is on a
 * page whose number says how far into the map that page is. */
static int page_map_find(MDB_env *env, PageMap *m) {
    MDB_txn *t;
    MDB_cursor *c;
    MDB_val k, v;
    MDB_stat stat;
    MDB_envinfo info;
    const char *page;
    uint64_t pgno;
    int rc;
    m->map = NULL;
    m->txn = NULL;
    if ((rc = mdb_env_stat(env, &stat)) != 0 || (rc = mdb_env_info(env, &info)) != 0)
        return rc;
    m->page_size = stat.ms_psize;
    m->map_size = info.me_mapsize;
    m->pages = info.me_last_pgno + 1;
    if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &t)) != 0)
        return rc;
    if ((rc = mdb_dbi_open(t, NULL, 0, &m->main)) == 0 && (rc = mdb_cursor_open(t, m->main, &c)) == 0) {
        if ((rc = mdb_cursor_get(c, &k, &v, MDB_FIRST)) == 0) {
            page = (const char *)((uintptr_t)k.mv_data & ~(uintptr_t)(m->page_size - 1));
            pgno = at64(page);
            m->map = page - pgno * m->page_size;
            if (pgno < 2 || pgno >= m->pages || pgno > (uintptr_t)page / m->page_size
                    || !page_sound(m, pgno, 0)) {
                m->map = NULL;
                rc = MDB_CORRUPTED;
            }
        }
        mdb_cursor_close(c);
    }
    mdb_txn_abort(t);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static void page_map_free(PageMap *m) {
    size_t i;
    for (i = 0; i < m->n_names; i++)
        free(m->names[i]);
    free(m->names);
    m->names = NULL;
    m->n_names = 0;
}
