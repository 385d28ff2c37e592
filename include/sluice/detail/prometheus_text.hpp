// Internal: the pieces of the Prometheus text exposition format 0.0.4 that every metrics writer
// shares (the engine's, each backend client's, the Envoy limiter's), and its content type. Light
// on purpose: a client's metrics header includes this, never the engine.
#ifndef SLUICE_DETAIL_PROMETHEUS_TEXT_HPP_
#define SLUICE_DETAIL_PROMETHEUS_TEXT_HPP_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"

namespace sluice {

// The Content-Type of the text the Prometheus writers (sluice/prometheus.hpp and each part's
// prometheus.hpp) write.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

namespace detail {

// One metric family: its HELP and TYPE lines.
struct PrometheusFamily {
  std::string_view name;
  std::string_view type;  // "counter" or "gauge"
  std::string_view help;
};

inline void append_prometheus_header(std::string& out, const PrometheusFamily& family) {
  for (std::string_view part : {std::string_view("# HELP "), family.name, std::string_view(" "),
                                family.help, std::string_view("\n# TYPE "), family.name,
                                std::string_view(" "), family.type, std::string_view("\n")}) {
    out.append(part);
  }
}

// A family of one sample without labels: its HELP and TYPE lines, then `name value`.
inline void append_prometheus_family(std::string& out, const PrometheusFamily& family,
                                     std::uint64_t value) {
  append_prometheus_header(out, family);
  out.append(family.name);
  absl::StrAppend(&out, " ", value, "\n");
}

// Appends `text` as the inside of a Prometheus label value: `\`, `"` and line feed escaped, every
// other byte as it is.
inline void append_prometheus_label_value(std::string& out, std::string_view text) {
  append_escaped(out, text, [](std::string& to, unsigned char byte) {
    if (byte == '\n') {
      to.append("\\n");
    } else {
      to.push_back(static_cast<char>(byte));
    }
  });
}

// A sample with one label: `name{label="<value, escaped>"} value`.
inline void append_prometheus_sample(std::string& out, std::string_view name,
                                     std::string_view label, std::string_view label_value,
                                     std::uint64_t value) {
  out.append(name);
  out.push_back('{');
  out.append(label);
  out.append("=\"");
  append_prometheus_label_value(out, label_value);
  absl::StrAppend(&out, "\"} ", value, "\n");
}

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_DETAIL_PROMETHEUS_TEXT_HPP_
