/* A hand-made hardware profile for tests: plausible figures of a 2-core
 * machine with NVMe, so planner and engine tests never measure. */
#ifndef PI2_TESTHW_H
#define PI2_TESTHW_H

#include "runtime/hwprof.h"

#include <string.h>

static inline void pi2t_fake_hw(pi2_hwprof *hw, int threads)
{
    memset(hw, 0, sizeof *hw);
    hw->threads = threads;
    snprintf(hw->cpu, sizeof hw->cpu, "test cpu");
    snprintf(hw->isa, sizeof hw->isa, "scalar");
    snprintf(hw->device, sizeof hw->device, ".");
    snprintf(hw->io_backend, sizeof hw->io_backend, "io_uring");
    snprintf(hw->measured_at, sizeof hw->measured_at, "2026-01-01T00:00:00Z");
    hw->seconds = 1;
    for (int t = 1; t <= threads; t++) {
        pi2_hw_compute *c = &hw->compute[t - 1];
        double s = t == 1 ? 1.0 : 1.0 + 0.8 * (t - 1); /* imperfect scaling */
        c->mem_bw = 12e9 * (t == 1 ? 1 : 1.5);
        c->int8_peak = 100e9 * s;
        c->gemv_q8 = 9e9 * (t == 1 ? 1 : 1.6);
        c->gemv_q4 = 7e9 * (t == 1 ? 1 : 1.6);
        c->matmul_q8 = 40e9 * s;
        c->matmul_q4 = 30e9 * s;
        c->sgemv = 8e9 * (t == 1 ? 1 : 1.5);
        for (int k = 0; k < PI2_HW_NLEN; k++) {
            double n = PI2_HW_ROW_LENS[k];
            c->gather_q8_ns[k] = (40 + n * 0.12) / s;
            c->gather_q4_ns[k] = (40 + n * 0.10) / s;
            c->down_q8_ns[k] = (50 + n * 0.20) / s;
            c->down_q4_ns[k] = (50 + n * 0.18) / s;
        }
        c->overlap = 0.5 / t;
    }
    for (int i = 0; i < PI2_HW_NSIZES; i++)
        for (int j = 0; j < PI2_HW_NDEPTHS; j++) {
            double size = PI2_HW_IO_SIZES[i], d = PI2_HW_IO_DEPTHS[j];
            double lat = 80e-6 + size / 2e9;                         /* one read alone */
            double iops = d / (lat + (d - 1) * (size / 1.5e9 + 5e-6)) * 1.0; /* saturates with depth */
            hw->io[i][j].iops = iops;
            hw->io[i][j].bytes_per_s = iops * size;
            hw->io[i][j].lat_us = d / iops * 1e6;
        }
    hw->seq_bps = 2e9;
}

#endif
