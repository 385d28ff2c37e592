// sluice/yaml.hpp — the YAML part of sluice: loads a gateway policy config (sluice::PolicyConfig)
// from YAML, with errors that name the line, column and value path.
//
//   #include <sluice/yaml.hpp>   // target sluice::yaml, links yaml-cpp
//
//   absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config_file("gateway.yaml");
//
// sluice/yaml/load_config.hpp  load_config, load_config_file: the loader and its error format
// sluice/yaml/limits.hpp       kMaxConfigBytes, kMaxConfigNodes: bounds on untrusted input
// sluice/yaml/reloading_engine.hpp  ReloadingEngine: an engine that follows its config file
//
// The core (sluice/sluice.hpp, sluice/engine.hpp) never includes this header. The layout of a
// config is described in docs/configuration.md.
#ifndef SLUICE_YAML_HPP_
#define SLUICE_YAML_HPP_

#include "sluice/yaml/limits.hpp"
#include "sluice/yaml/load_config.hpp"
#include "sluice/yaml/reloading_engine.hpp"

#endif  // SLUICE_YAML_HPP_
