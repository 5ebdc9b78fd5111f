// HEADWAY_API marks the symbols the shared library exports; everything else is
// hidden (the library is built with -fvisibility=hidden).
#ifndef HEADWAY_EXPORT_H_
#define HEADWAY_EXPORT_H_

#if defined(_WIN32)
#define HEADWAY_API
#else
#define HEADWAY_API [[gnu::visibility("default")]]
#endif

#endif  // HEADWAY_EXPORT_H_
