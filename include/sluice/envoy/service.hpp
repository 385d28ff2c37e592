// sluice/envoy/service.hpp — `envoy.service.ratelimit.v3.RateLimitService` for any gRPC C++
// server, deciding with a sluice::envoy::BasicLimiter.
//
//   auto limiter = sluice::envoy::Limiter::create(*sluice::envoy::load_config_directory(dir));
//   sluice::envoy::RateLimitService service(**limiter);  // must outlive the server
//   grpc::ServerBuilder builder;
//   builder.AddListeningPort("0.0.0.0:8081", grpc::InsecureServerCredentials());
//   builder.RegisterService(&service);
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//
// Errors: a request that breaks the limiter's bounds or the protocol answers INVALID_ARGUMENT
// with the reason; nothing else fails the call (a backend failure is decided by the limiter's
// failure mode). Beyond the message gRPC parsed, a call converts at most one descriptor past the
// limiter's bound and one entry past it per descriptor.
// Thread-safety: ShouldRateLimit may run concurrently on any number of threads.
#ifndef SLUICE_ENVOY_SERVICE_HPP_
#define SLUICE_ENVOY_SERVICE_HPP_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/container/inlined_vector.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "sluice/envoy/limiter.hpp"
#include "sluice/envoy/request.hpp"

namespace sluice::envoy {

namespace rls = ::envoy::service::ratelimit::v3;

template <EngineBackend Backend>
class BasicRateLimitService final : public rls::RateLimitService::Service {
 public:
  explicit BasicRateLimitService(const BasicLimiter<Backend>& limiter) : limiter_(limiter) {}

  grpc::Status ShouldRateLimit(grpc::ServerContext* /*context*/,
                               const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* reply) override {
    const RequestBounds& bounds = limiter_.bounds();
    const int n = within(request->descriptors_size(), bounds.max_descriptors);
    absl::InlinedVector<Entry, 16> entries;
    absl::InlinedVector<Descriptor, 8> descriptors;
    for (int i = 0; i < n; ++i) {
      const auto& d = request->descriptors(i);
      for (int k = 0; k < within(d.entries_size(), bounds.max_entries); ++k) {
        entries.push_back({d.entries(k).key(), d.entries(k).value()});
      }
    }
    std::size_t next = 0;
    for (int i = 0; i < n; ++i) {
      const auto& d = request->descriptors(i);
      const auto m = static_cast<std::size_t>(within(d.entries_size(), bounds.max_entries));
      Descriptor& out = descriptors.emplace_back();
      out.entries = std::span<const Entry>(entries.data() + next, m);
      next += m;
      if (d.has_limit()) {
        out.limit = LimitOverride{.requests_per_unit = d.limit().requests_per_unit(),
                                  .unit = unit_of(static_cast<int>(d.limit().unit()))};
      }
      if (d.has_hits_addend()) out.hits_addend = d.hits_addend().value();
    }
    Response response;
    const absl::Status s = limiter_.should_rate_limit({.domain = request->domain(),
                                                       .descriptors = descriptors,
                                                       .hits_addend = request->hits_addend()},
                                                      response);
    if (!s.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
    write(response, *reply);
    return grpc::Status::OK;
  }

 private:
  // The first `count` items, but at most one past `bound`: enough for the limiter to refuse a
  // request over the bound with its reason, and nothing converted for what lies beyond it.
  static int within(int count, std::size_t bound) {
    return static_cast<std::size_t>(count) > bound ? static_cast<int>(bound) + 1 : count;
  }

  static Unit unit_of(int wire) {
    return wire >= static_cast<int>(Unit::kSecond) && wire <= static_cast<int>(Unit::kYear)
               ? static_cast<Unit>(wire)
               : Unit::kUnknown;
  }

  static void write(const Response& response, rls::RateLimitResponse& reply) {
    reply.set_overall_code(static_cast<rls::RateLimitResponse::Code>(response.overall_code));
    for (const DescriptorStatus& s : response.statuses) {
      rls::RateLimitResponse::DescriptorStatus* out = reply.add_statuses();
      out->set_code(static_cast<rls::RateLimitResponse::Code>(s.code));
      if (s.current_limit) {
        auto* limit = out->mutable_current_limit();
        limit->set_name(s.current_limit->name);
        limit->set_requests_per_unit(s.current_limit->requests_per_unit);
        limit->set_unit(
            static_cast<rls::RateLimitResponse::RateLimit::Unit>(s.current_limit->unit));
      }
      out->set_limit_remaining(s.limit_remaining);
      if (s.duration_until_reset.count() > 0) {
        const auto secs = std::chrono::duration_cast<std::chrono::seconds>(s.duration_until_reset);
        out->mutable_duration_until_reset()->set_seconds(secs.count());
        out->mutable_duration_until_reset()->set_nanos(
            static_cast<std::int32_t>((s.duration_until_reset - secs).count()));
      }
    }
    for (const HttpField& field : response.headers) {
      auto* header = reply.add_response_headers_to_add();
      header->set_key(std::string(field.name));
      header->set_value(field.value);
    }
  }

  const BasicLimiter<Backend>& limiter_;
};

using RateLimitService = BasicRateLimitService<InMemoryBackend<>>;

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_SERVICE_HPP_
