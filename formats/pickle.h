/* The restricted pickle interpreter of torchzip.h: its values, its machine
 * state and the calls torchzip.c makes. Private to formats/pickle.c and
 * formats/torchzip.c. */
#ifndef PI2_FORMATS_PICKLE_H
#define PI2_FORMATS_PICKLE_H

#include "formats/zip.h"

/* Pickle opcodes (Python's Lib/pickle.py); those handled are marked. */
enum {
    OP_MARK = '(', OP_STOP = '.', OP_POP = '0', OP_POP_MARK = '1', OP_DUP = '2', OP_FLOAT = 'F', OP_INT = 'I',
    OP_BININT = 'J' /* handled */, OP_BININT1 = 'K' /* handled */, OP_LONG = 'L', OP_BININT2 = 'M' /* handled */,
    OP_NONE = 'N' /* handled */, OP_PERSID = 'P', OP_BINPERSID = 'Q' /* handled */, OP_REDUCE = 'R' /* handled */,
    OP_STRING = 'S', OP_BINSTRING = 'T', OP_SHORT_BINSTRING = 'U', OP_UNICODE = 'V',
    OP_BINUNICODE = 'X' /* handled */, OP_APPEND = 'a' /* handled */, OP_BUILD = 'b' /* handled */,
    OP_GLOBAL = 'c' /* handled */, OP_DICT = 'd', OP_EMPTY_DICT = '}' /* handled */, OP_APPENDS = 'e' /* handled */,
    OP_GET = 'g', OP_BINGET = 'h' /* handled */, OP_INST = 'i', OP_LONG_BINGET = 'j' /* handled */, OP_LIST = 'l',
    OP_EMPTY_LIST = ']' /* handled */, OP_OBJ = 'o', OP_PUT = 'p', OP_BINPUT = 'q' /* handled */,
    OP_LONG_BINPUT = 'r' /* handled */, OP_SETITEM = 's' /* handled */, OP_TUPLE = 't' /* handled */,
    OP_EMPTY_TUPLE = ')' /* handled */, OP_SETITEMS = 'u' /* handled */, OP_BINFLOAT = 'G',
    OP_PROTO = 0x80 /* handled */, OP_NEWOBJ = 0x81, OP_EXT1 = 0x82, OP_EXT2 = 0x83, OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85 /* handled */, OP_TUPLE2 = 0x86 /* handled */, OP_TUPLE3 = 0x87 /* handled */,
    OP_NEWTRUE = 0x88 /* handled */, OP_NEWFALSE = 0x89 /* handled */, OP_LONG1 = 0x8a /* handled */,
    OP_LONG4 = 0x8b, OP_BINBYTES = 'B', OP_SHORT_BINBYTES = 'C', OP_SHORT_BINUNICODE = 0x8c /* handled */,
    OP_BINUNICODE8 = 0x8d /* handled */, OP_BINBYTES8 = 0x8e, OP_EMPTY_SET = 0x8f, OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91, OP_NEWOBJ_EX = 0x92, OP_STACK_GLOBAL = 0x93 /* handled */, OP_MEMOIZE = 0x94 /* handled */,
    OP_FRAME = 0x95 /* handled */, OP_BYTEARRAY8 = 0x96, OP_NEXT_BUFFER = 0x97, OP_READONLY_BUFFER = 0x98,
};

enum { PV_NONE, PV_BOOL, PV_INT, PV_STR, PV_GLOBAL, PV_TUPLE, PV_LIST, PV_DICT, PV_STORAGE, PV_TENSOR };

/* The allowed globals; a storage type is G_STORAGE + its pi2_dtype. */
enum { G_ODICT = 1, G_REBUILD_V2, G_REBUILD_PARAM, G_STORAGE };

/* A pickle value. Containers are references (indices), as in Python. */
typedef struct pv {
    uint8_t kind;
    uint8_t g;  /* PV_GLOBAL: G_* */
    uint32_t n; /* PV_STR: byte length; PV_TUPLE: item count */
    uint64_t u; /* PV_INT: value bits; PV_BOOL: 0/1; PV_STR: offset in data.pkl; PV_TUPLE: first item in
                 * kids; PV_DICT, PV_STORAGE, PV_TENSOR: index into their arrays */
} pv;

typedef struct pdict {
    uint32_t nitems;
    bool ordered; /* made by collections.OrderedDict(): BUILD may set its attributes */
} pdict;

typedef struct pitem {
    uint32_t dict;
    pv k, v;
} pitem;

typedef struct pstor {
    uint32_t member;
    pi2_dtype dt;
    uint64_t numel;
} pstor;

typedef struct ptens {
    uint32_t stor;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    size_t nelem;
    uint64_t offset; /* elements into the storage */
} ptens;

/* the heap bound stated in torchzip.h */
_Static_assert(sizeof(pv) == 16 && sizeof(pitem) <= 40 && sizeof(pdict) <= 40 && sizeof(pstor) <= 40 &&
                   sizeof(ptens) <= 88,
               "pickle object sizes as torchzip.h states them");

typedef struct pk {
    const char *path;
    shown pkl;          /* "A/data.pkl", for messages */
    const uint8_t *img; /* the whole file */
    size_t img_len;
    const uint8_t *p0;  /* data.pkl, as libarchive read it (pkl_copy) */
    uint8_t *pkl_copy;
    size_t len;
    size_t at; /* offset of the opcode being run */
    pi2_err *err;
    /* zip */
    const zmem *m;
    size_t nm;
    const uint32_t *sorted; /* member indices by name */
    const uint8_t *prefix;  /* archive folder name, without '/' */
    size_t plen;
    uint32_t *mem_stor; /* member -> storage index + 1 */
    /* machine */
    pv *st;
    size_t sp, scap;
    size_t marks[PI2_TZ_MAX_MARKS];
    size_t nmarks;
    pv *memo;
    size_t nmemo, memocap;
    pv *kids;
    size_t nkids, kidcap;
    pdict *dicts;
    size_t ndicts, dictcap;
    pitem *items;
    size_t nitems, itemcap;
    pstor *stors;
    size_t nstors, storcap;
    ptens *tens;
    size_t ntens, tenscap;
    size_t nobj;
} pk;

int pk_fail(pk *k, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
extern const char *const pk_kind_name[];
const char *pk_storage_name(pi2_dtype dt);
int pk_nomem(pk *k);
shown pk_str(const pk *k, pv v);
int64_t pk_member(const pk *k, const char *a, const uint8_t *b, size_t blen);
int pk_run(pk *k, pv *result);
void pk_free(pk *k);

#endif
