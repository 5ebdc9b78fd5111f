// Process-wide start-up that every public entry point runs before dispatching.
#ifndef HEADWAY_LIB_CORE_INIT_H_
#define HEADWAY_LIB_CORE_INIT_H_

namespace headway {
namespace internal {

// Records the CPU's targets and applies HEADWAY_MAX_TARGET; runs once per
// process, cheap after.
void InitOnce();

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_CORE_INIT_H_
