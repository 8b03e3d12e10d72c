// The shim's exception guard, shared by its translation units (not part of the C API, and
// not read by the binding generator).
#ifndef LLAMAPY_GUARD_HPP
#define LLAMAPY_GUARD_HPP

#include "llamapy_shim.h"

#include <cstring>
#include <exception>
#include <new>

namespace llamapy {

// Copy ``text`` into ``what`` (``what_size`` bytes, always NUL-terminated).
inline void copy_what(char * what, size_t what_size, const char * text) {
    if (what == nullptr || what_size == 0) {
        return;
    }
    std::strncpy(what, text, what_size - 1);
    what[what_size - 1] = '\0';
}

// Run fn (which returns a status) and map any exception it throws to a status.
template <typename F>
int guard(char * what, size_t what_size, F && fn) noexcept {
    try {
        return fn();
    } catch (const std::bad_alloc & err) {
        copy_what(what, what_size, err.what());
        return LLAMAPY_ERR_NO_MEMORY;
    } catch (const std::exception & err) {
        copy_what(what, what_size, err.what());
        return LLAMAPY_ERR_EXCEPTION;
    } catch (...) {
        copy_what(what, what_size, "an exception that is not a std::exception");
        return LLAMAPY_ERR_UNKNOWN;
    }
}

}  // namespace llamapy

#endif  // LLAMAPY_GUARD_HPP
