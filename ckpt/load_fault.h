/* load_fault.h: the test hook of the load's digest check (engine_load.c;
 * tests/test_load_digest.sh). Internal. The command sets it from the
 * environment variable TSR_FAULT_LOAD (tools/cli.c).
 *
 * engine_set_fault_load(): a layout-conversion bug planted in what each rank of
 * a load reads, which the frames' checksums cannot see (the bytes are sound, the
 * box is wrong); 0 for none:
 *   ENGINE_FAULT_SHIFT  every box a rank reads is read one row (dim 0) off
 *   ENGINE_FAULT_SWAP   ranks 0 and 1 read each other's box of each tensor (one
 *                       of the same extents)
 *   ENGINE_FAULT_BCAST  every rank reads rank 0's box of each tensor (one of the
 *                       same extents as its own)
 *   ENGINE_FAULT_SEND   a box's reader reads it right but sends the other ranks
 *                       that hold it a copy with one bit of its last byte
 *                       flipped
 *   ENGINE_FAULT_DECODE every frame a codec decodes comes out with one bit
 *                       flipped (a decoder gone wrong: the stored bytes are
 *                       sound; the raw checksum, or the digest where it stands
 *                       in for it, sees it); tsr_ckpt_set_fault_decode */
#ifndef TSR_LOAD_FAULT_H
#define TSR_LOAD_FAULT_H

enum { ENGINE_FAULT_SHIFT = 1, ENGINE_FAULT_SWAP, ENGINE_FAULT_BCAST, ENGINE_FAULT_SEND, ENGINE_FAULT_DECODE };
void engine_set_fault_load(int kind);
void tsr_ckpt_set_fault_decode(int on); /* read.c */

#endif
