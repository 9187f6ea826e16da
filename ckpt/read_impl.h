/* read_impl.h: what the reader (read.c) shares with the checkpoint's verifier
 * (verify.c): the open checkpoint, its data files and the frame reads. */
#ifndef TSR_READ_IMPL_H
#define TSR_READ_IMPL_H

#include <limits.h>
#include <pthread.h>

#include "codec.h"
#include "manifest.h"
#include "store.h"
#include "tsr_ckpt.h"

typedef struct data_file {
    pthread_mutex_t mu;
    tsr_rfile *rf;
    int state; /* 0 unopened, 1 open and checked, <0 the tsr_status it failed with */
    tsr_error err;
} data_file;

struct reader;

struct tsr_ckpt {
    char dir[PATH_MAX];
    tsr_store *store;
    tsr_manifest m;
    data_file *files; /* parallel to m.files */
    uint64_t *tensor_stored;
    pthread_mutex_t codec_mu;
    struct reader **free_codecs; /* idle readers (codec and buffers) */
    size_t n_free_codecs, cap_free_codecs;
};

/* Buffers reused across the frames one thread reads. */
typedef struct frame_buf {
    uint8_t *stored; /* aligned */
    size_t stored_cap;
    uint8_t *raw;
    size_t raw_cap;
    const uint8_t *out; /* the frame's elements: raw, or stored for a raw frame */
} frame_buf;

void ckpt_frame_buf_free(frame_buf *b);
/* The index in m.files of the data file with id `id` (the manifest has it). */
size_t ckpt_file_index(const tsr_ckpt *ck, uint32_t id);
/* Data file fi, opened on first use, its size and header checked. */
int ckpt_open_file(tsr_ckpt *ck, size_t fi, tsr_rfile **out, tsr_error *err);
/* Reads frame fi, checks its padding and both checksums (with by_digest
 * neither) and decodes it into b->out, or with `into` straight there. */
int ckpt_read_frame(tsr_ckpt *ck, size_t fi, int dtype, const char *owner, frame_buf *b, uint8_t *into,
                    tsr_codec *codec, int by_digest, tsr_error *err);

#endif
