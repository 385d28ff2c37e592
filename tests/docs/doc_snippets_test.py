#!/usr/bin/env python3
"""Compiles every ```cpp block of README.md and docs/*.md, so that a doc that does not compile, or
names an API that does not exist, fails the test.

Each block is preceded by an HTML comment (invisible on the rendered page) that says what it is:

  <!-- snippet: file examples/metrics/main.cpp -->  the block is that file, verbatim (the build
                                                   compiles it and a test runs it)
  <!-- snippet: program -->                         a complete source file
  <!-- snippet: body CONTEXT -->                    statements inside a function of the
                                                   application: CONTEXT (below) says what the
                                                   application has at hand (config, engine, ...)
  <!-- snippet: synopsis -->                        declarations that summarize a header: every
                                                   name declared must exist under include/sluice

Blocks are compiled with -fsyntax-only, grouped into one translation unit per set of optional
parts, with the flags the build used for a test of those parts (from compile_commands.json), so
no flag list is kept here. `#include` lines are hoisted to the top of the unit; each block lives
in its own namespace, and errors point at the block's lines in the .md file (#line).
A part that is not built on this machine (its dependency is missing) is skipped and named.
Usage: doc_snippets_test.py <source dir> <build dir>
Exit 77 (skipped) when the build has no compile_commands.json.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

OPTIONAL_PARTS = ("redis", "postgres", "yaml", "grpc", "httplib", "envoy")

# The test program whose compile command a unit borrows (its source: a test file, or the unit
# tests/CMakeLists.txt generates for a group of them in the build tree), and the parts that
# command can compile, in order of preference: a block goes into the first unit, among those
# built here, that covers its parts. The broadest come first, so that the core's blocks share a
# unit (each unit parses the core's headers once: fewer units, less compile time).
UNITS = (
    ("tests/grpc_test.cpp", {"core", "grpc", "envoy", "redis", "yaml"}),
    ("tests/http_tests.cpp", {"core", "httplib", "yaml"}),
    ("tests/postgres_test.cpp", {"core", "postgres"}),
    ("tests/redis_tests.cpp", {"core", "redis"}),
    ("tests/core_tests.cpp", {"core"}),
)

# What the application has at hand in a `body` block: (part, return type, parameters).
CONTEXTS = {
    "none": ("core", "absl::Status", ""),
    "main": ("core", "int", ""),
    "app": ("core", "absl::Status",
            "const sluice::PolicyConfig& config, std::string_view client_ip"),
    "request": ("core", "absl::Status",
                "const sluice::PolicyConfig& config, std::string_view bearer_token"),
    "engine": ("core", "absl::Status",
               "const std::shared_ptr<const sluice::RateLimitEngine>& engine, "
               "const sluice::ClientAddress& resolved, sluice::Evaluation& reused"),
    "engine_request": ("core", "absl::Status",
                       "const std::shared_ptr<const sluice::RateLimitEngine>& engine, "
                       "const sluice::RequestContext& request"),
    "engine_ref": ("core", "absl::Status",
                   "const sluice::RateLimitEngine& engine, std::string_view ip, "
                   "std::string_view path, const std::string& prompt"),
    "attempt": ("core", "absl::Status",
                "absl::StatusOr<sluice::AttemptLimiter<>>& limiter, std::string_view subject"),
    "proxy_headers": ("core", "absl::Status",
                      "const sluice::ClientAddress& peer_address, "
                      "std::string_view forwarded_header, std::string_view x_forwarded_for_header"),
    "resolver": ("core", "absl::Status",
                 "const sluice::ClientAddressResolver& resolver, const sluice::ClientAddress& peer, "
                 "std::string_view forwarded, std::string_view x_forwarded_for"),
    "httplib": ("httplib", "absl::Status", ""),
    "login": ("httplib", "absl::Status",
              "std::string_view subject, httplib::Response& response, const std::string& user, "
              "const std::string& password"),
    "login_limiter": ("httplib", "absl::Status",
                      "absl::StatusOr<sluice::AttemptLimiter<>>& limiter, std::string_view subject, "
                      "httplib::Response& response"),
    "on_admitted": ("httplib", "absl::Status",
                    "const httplib::Request& request, "
                    "const sluice::HttplibLimiter<>::LimitedRequest& limited, "
                    "httplib::Client& upstream"),
    "redis": ("redis", "absl::Status",
              "const sluice::PolicyConfig& config, std::string_view client_ip, "
              "std::string_view api_key, std::string_view subject"),
    "redis_client": ("redis", "absl::Status",
                     "const std::shared_ptr<sluice::redis::Client>& client, "
                     "std::string_view client_ip"),
    "postgres": ("postgres", "absl::Status", "std::string_view client_ip"),
    "postgres_limiter": ("postgres", "absl::Status",
                         "absl::StatusOr<sluice::postgres::PostgresGcraLimiter>& limiter, "
                         "std::string_view client_ip"),
    "envoy": ("envoy", "absl::Status", "grpc::ServerBuilder& builder"),
    "envoy_redis": ("envoy", "absl::Status",
                    "const absl::StatusOr<sluice::envoy::ServiceConfig>& config, "
                    "const std::shared_ptr<sluice::redis::Client>& client"),
}

# The application's own helpers that blocks call, declared (never defined: syntax only).
PRELUDE = {
    "core": """#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/attempt.hpp"
#include "sluice/client_address.hpp"
#include "sluice/engine.hpp"
#include "sluice/policy.hpp"
namespace doc_app {
using namespace std::chrono_literals;
inline constexpr std::uint64_t kFleetSeed = 0x5eed;
inline constexpr std::uint64_t kFleetSecretSeed = 0x5eed;
struct Response { int status = 0; std::chrono::nanoseconds retry_after{0}; };
Response forward_to_upstream(const sluice::RequestContext& request);
absl::Status reply_429(const sluice::HttpFields& fields);
absl::Status respond(int status);
void respond(int status, const sluice::HttpFields& fields);
void respond_429(std::chrono::nanoseconds retry_after);
absl::Status fail_closed();
bool verify_password(const std::string& user, const std::string& password);
std::uint64_t run_model(const std::string& prompt);
void count_local_decision();
}  // namespace doc_app
""",
    "httplib": '#include "sluice/httplib.hpp"\n',
    "yaml": '#include "sluice/yaml.hpp"\n',
    "redis": '#include "sluice/redis.hpp"\n',
    "postgres": '#include "sluice/postgres.hpp"\n',
    "grpc": '#include "sluice/grpc.hpp"\n',
    "envoy": '#include "sluice/envoy.hpp"\n#include <grpcpp/grpcpp.h>\n',
}

# Warnings a fragment cannot avoid (a block shows a value it then does not use).
EXTRA_FLAGS = ["-fsyntax-only", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
               "-Wno-unused-function", "-Wno-unused-parameter", "-Wno-unused-local-typedefs",
               "-Wno-subobject-linkage"]

ANNOTATION = re.compile(r"^<!-- snippet: (.+?) -->$")


class Block:
    def __init__(self, path, line, text, annotation):
        self.path, self.line, self.text, self.annotation = path, line, text, annotation


def blocks_of(source_dir, relative):
    lines = open(os.path.join(source_dir, relative), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            match = ANNOTATION.match(lines[i - 1].strip()) if i > 0 else None
            out.append(Block(relative, i + 2, "\n".join(lines[i + 1:j]) + "\n",
                             match.group(1) if match else None))
            i = j
        i += 1
    return out


def parts_of(text):
    """The optional parts a block's includes name."""
    parts = set()
    for include in re.findall(r'^\s*#include [<"]([^>"]+)[>"]', text, re.M):
        head = re.match(r"sluice/([a-z_]+)", include)
        if head and head.group(1) in OPTIONAL_PARTS:
            parts.add(head.group(1))
        elif include.startswith("grpcpp/"):
            parts.add("grpc")
        elif include == "httplib.h":
            parts.add("httplib")
    return parts


def check_synopsis(source_dir, block, errors):
    """Every name a synopsis declares exists under include/sluice."""
    names = set(re.findall(r"\b(?:struct|class|enum class|using)\s+([A-Za-z_]\w*)", block.text))
    names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", block.text))
    names |= set(re.findall(r"\bconstexpr\s+[\w:<>]+\s+(k\w+)", block.text))
    keywords = {"if", "for", "while", "return", "sizeof", "decltype", "operator", "static_cast",
                "noexcept", "requires", "alignas", "namespace"}
    text = ""
    for root, _, files in os.walk(os.path.join(source_dir, "include", "sluice")):
        for name in files:
            text += open(os.path.join(root, name), encoding="utf-8").read()
    for name in sorted(names - keywords):
        if not re.search(r"\b%s\b" % re.escape(name), text):
            errors.append("%s:%d: the synopsis names `%s`, which no header under include/sluice "
                          "declares" % (block.path, block.line, name))


def wrap(index, block, errors):
    """(includes, code, parts) of a block as it goes into a unit; None when it is not compiled."""
    kind, _, rest = block.annotation.partition(" ")
    includes = "".join(l + "\n" for l in block.text.split("\n") if l.startswith("#include"))
    body = "\n".join("" if l.startswith("#include") else l for l in block.text.split("\n"))
    line = '#line %d "%s"\n' % (block.line, block.path)
    parts = parts_of(block.text)
    if kind == "program":
        code = "namespace doc_snippet_%d {\n%s%s}\n" % (index, line, body)
        return includes, code, parts
    if kind == "body" and rest in CONTEXTS:
        part, result, parameters = CONTEXTS[rest]
        parts.add(part)
        tail = "return absl::OkStatus();" if result == "absl::Status" else "return 0;"
        code = ("namespace doc_snippet_%d {\nusing namespace doc_app;\n"
                "[[maybe_unused]] %s snippet(%s) {\n%s%s\n%s\n}\n}\n"
                % (index, result, parameters, line, body, tail))
        return includes, code, parts
    errors.append("%s:%d: unknown snippet annotation `%s` (file PATH, program, body CONTEXT with "
                  "CONTEXT one of %s, synopsis)"
                  % (block.path, block.line, block.annotation, ", ".join(sorted(CONTEXTS))))
    return None


def unit_command(commands, source_dir, test_source, unit_path):
    """The build's compile command for `test_source`, turned into a syntax check of unit_path."""
    wanted = os.path.realpath(os.path.join(source_dir, test_source))
    generated = os.path.join("tests", os.path.basename(test_source))
    for entry in commands:
        if entry["file"].endswith(os.sep + generated):  # a group's unit, in the build tree
            wanted = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
        if os.path.realpath(os.path.join(entry["directory"], entry["file"])) != wanted:
            continue
        args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
        out, skip = [], False
        for arg in args:
            if skip:
                skip = False
            elif arg in ("-o", "-MF", "-MT", "-MQ"):
                skip = True
            elif arg in ("-c", "-MD", "-MMD") or os.path.realpath(
                    os.path.join(entry["directory"], arg)) == wanted:
                pass
            else:
                out.append(arg)
        return out + EXTRA_FLAGS + [unit_path], entry["directory"]
    return None


def check_readme_docs(source_dir, errors):
    """README's documentation list names every doc once."""
    readme = open(os.path.join(source_dir, "README.md"), encoding="utf-8").read()
    section = readme.split("## Documentation", 1)[-1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `(docs/[^`]+\.md)`", section, re.M)
    for doc in sorted(set(listed)):
        if listed.count(doc) > 1:
            errors.append("README.md: the documentation list names %s %d times"
                          % (doc, listed.count(doc)))
    for doc in sorted(os.listdir(os.path.join(source_dir, "docs"))):
        if doc.endswith(".md") and "docs/" + doc not in listed:
            errors.append("README.md: the documentation list does not name docs/%s" % doc)


def main():
    source_dir, build_dir = sys.argv[1], sys.argv[2]
    database = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(database):
        print("doc_snippets: skipped: %s is missing (configure with a preset)" % database)
        return 77
    available = available_units(json.load(open(database, encoding="utf-8")), source_dir)
    errors = []
    check_readme_docs(source_dir, errors)
    units, count = sort_blocks(source_dir, available, errors)
    jobs = write_units(units, available)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for test_source, blocks, result, seconds in pool.map(compile_unit, jobs):
            status = "ok" if result.returncode == 0 else "FAILED"
            print("doc_snippets: %d blocks with the flags of %s: %s (%.1f s)"
                  % (blocks, test_source, status, seconds))
            if result.returncode != 0:
                errors.append(result.stderr.strip())
    for error in errors:
        print(error, file=sys.stderr)
    print("doc_snippets: %d blocks, %d errors" % (count, len(errors)))
    return 1 if errors else 0


def available_units(commands, source_dir):
    """test source -> (arguments, directory, unit path), for the units this build can compile."""
    work = tempfile.mkdtemp(prefix="doc_snippets.")
    available = {}
    for test_source, _ in UNITS:
        unit_path = os.path.join(work, os.path.basename(test_source).replace("_test", "_docs"))
        command = unit_command(commands, source_dir, test_source, unit_path)
        if command is not None:
            available[test_source] = command + (unit_path,)
    return available


def sort_blocks(source_dir, available, errors):
    """Checks the blocks that are not compiled; returns the others by unit, and the block count."""
    docs = ["README.md"] + sorted("docs/" + d for d in os.listdir(os.path.join(source_dir, "docs"))
                                  if d.endswith(".md"))
    units, count = {}, 0
    for block in (b for doc in docs for b in blocks_of(source_dir, doc)):
        count += 1
        if block.annotation is None:
            errors.append("%s:%d: a ```cpp block without a <!-- snippet: ... --> comment on "
                          "the line before it" % (block.path, block.line - 1))
        elif block.annotation.startswith("file "):
            path = block.annotation[5:]
            full = os.path.join(source_dir, path)
            if not os.path.exists(full) or open(full, encoding="utf-8").read() != block.text:
                errors.append("%s:%d: the block is not %s as it is (copy the file in)"
                              % (block.path, block.line, path))
        elif block.annotation == "synopsis":
            check_synopsis(source_dir, block, errors)
        else:
            wrapped = wrap(count, block, errors)
            if wrapped is None:
                continue
            unit = next((t for t, covered in UNITS if t in available and wrapped[2] <= covered),
                        None)
            if unit is None:
                print("doc_snippets: skipped %s:%d: the parts %s are not built here"
                      % (block.path, block.line, sorted(wrapped[2])))
            else:
                units.setdefault(unit, []).append(wrapped)
    return units, count


def write_units(units, available):
    """Writes each unit's file; the compile jobs."""
    jobs = []
    for test_source, _ in UNITS:
        if test_source not in units:
            continue
        parts = set().union(*(w[2] for w in units[test_source])) | {"core"}
        args, directory, unit_path = available[test_source]
        with open(unit_path, "w", encoding="utf-8") as unit:
            unit.write("".join(PRELUDE[p] for p in ["core"] + sorted(parts - {"core"})))
            unit.write("".join(w[0] for w in units[test_source]))
            unit.write("".join(w[1] for w in units[test_source]))
        jobs.append((test_source, len(units[test_source]), (args, directory)))
    return jobs


def compile_unit(job):
    test_source, blocks, (args, directory) = job
    started = time.monotonic()
    result = subprocess.run(args, cwd=directory, capture_output=True, text=True)
    return test_source, blocks, result, time.monotonic() - started


if __name__ == "__main__":
    sys.exit(main())
