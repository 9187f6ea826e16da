/* embed.c: the token embedding lookup and its scatter-add backward. */
#include "embed.h"

#include <stddef.h>
#include <string.h>

void tsr_embed_fwd(float *out, const int *tokens, const float *wte, int N, int C, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;
        int tok = tokens[i];
        if (tok >= 0 && tok < V) memcpy(o, wte + (size_t)tok * C, (size_t)C * sizeof *o);
        else memset(o, 0, (size_t)C * sizeof *o);
    }
}

/* Several positions may hold the same token, so the threads split the columns,
 * not the positions: no two threads touch one element, and every element sums
 * its positions in order whatever the thread count. */
#define EMBED_COLS 64 /* columns per task: 256 bytes of each row */

void tsr_embed_bwd(float *dwte, const float *dout, const int *tokens, int N, int C, int V) {
    if (!dwte || N <= 0 || C <= 0) return;
    int nblk = (C + EMBED_COLS - 1) / EMBED_COLS;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nblk; b++) {
        int c0 = b * EMBED_COLS, c1 = c0 + EMBED_COLS < C ? c0 + EMBED_COLS : C;
        for (int i = 0; i < N; i++) {
            int tok = tokens[i];
            if (tok < 0 || tok >= V) continue;
            float *d = dwte + (size_t)tok * C;
            const float *g = dout + (size_t)i * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}
