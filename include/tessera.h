/*
 * tessera.h: the public interface of libtessera.
 *
 * libtessera writes and reads tessera checkpoints (format v1, specified in
 * formats/FORMAT.md): global tensors stored as boxes ("chunks") cut into
 * independently encoded, checksummed frames, plus named blobs, committed
 * atomically by a MANIFEST written last.
 *
 * Conventions, for every function below:
 *  - Functions that can fail return an int: 0 (TSR_OK) on success, or a
 *    negative tsr_status. When the caller passes a non-NULL `tsr_error *err`,
 *    err->code receives the same status and err->msg a one-line message that
 *    names the file, tensor, frame or request and the reason, e.g.
 *    "ck/step-00000010/data-00003.tsd: frame 17 of layers.4.wq: checksum mismatch".
 *  - Functions returning a pointer return NULL on failure and fill *err.
 *  - The library never exits the process and never prints; diagnostics go to the
 *    logging hook (tsr_set_log) only.
 *  - Nothing read from a file is trusted: every count, offset, size and shape is
 *    checked before use, and a file that breaks a rule of FORMAT.md is refused
 *    with TSR_ECORRUPT.
 *  - Objects are not thread-safe unless stated; distinct objects may be used from
 *    distinct threads.
 */
#ifndef TESSERA_H
#define TESSERA_H

/* The interface is declared layer by layer (README, "Layout"); this header
 * gathers them. */
#include "tsr_base.h"
#include "tsr_formats.h"
#include "tsr_reshard.h"
#include "tsr_comm.h"
#include "tsr_ckpt.h"
#include "tsr_convert.h"

#endif
