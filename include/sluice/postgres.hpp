// sluice/postgres.hpp — the umbrella header of the PostgreSQL part (target sluice::postgres,
// libpq).
//
// Limits shared through a PostgreSQL database: GCRA and fixed-window limiters, batches, and the
// policy engine over the database. See docs/postgres.md for setup, migration, capacity, cleanup
// and failure semantics.
//
//   auto client = sluice::postgres::Client::create({.connection = {.conninfo = "dbname=app"},
//                                                    .key_seed = kFleetSeed});
//   if (!client.ok()) return client.status();
//   if (auto v = sluice::postgres::migrate((*client)->pool()); !v.ok()) return v.status();
//   auto limiter = sluice::postgres::PostgresGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::seconds(1)}}, *client, "api");
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);
#ifndef SLUICE_POSTGRES_HPP_
#define SLUICE_POSTGRES_HPP_

#include "sluice/postgres/client.hpp"
#include "sluice/postgres/connection_pool.hpp"
#include "sluice/postgres/engine_backend.hpp"
#include "sluice/postgres/limit.hpp"
#include "sluice/postgres/limiter.hpp"
#include "sluice/postgres/schema.hpp"

#endif  // SLUICE_POSTGRES_HPP_
