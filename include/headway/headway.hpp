// Headway: SIMD CPU kernels for transformer attention. The whole C++ API.
#ifndef HEADWAY_HEADWAY_HPP_
#define HEADWAY_HEADWAY_HPP_

#include "headway/attention.h"
#include "headway/kv_cache.h"
#include "headway/layer.h"
#include "headway/matmul.h"
#include "headway/norm.h"
#include "headway/rope.h"
#include "headway/softmax.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/threads.h"
#include "headway/version.h"
#include "headway/view.h"

#endif  // HEADWAY_HEADWAY_HPP_
