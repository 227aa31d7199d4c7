// Calls with raw bytes, as a client that does not use the generated code (or a
// hostile one) makes them: any method name, any message bytes, in any order.
#pragma once

#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace mx_test {

struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;  // every message the server sent
};

// Sends `messages` (raw bytes each) on `method` ("/mxserve.v1.Compute/Gemm"),
// half-closes, reads every response and the status. Works for unary and
// streaming methods alike: on the wire every call is a stream. `token`, when
// given, goes as `authorization: Bearer <token>` metadata.
inline RawResult RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                         const std::vector<std::string>& messages, double timeout_seconds = 30,
                         const std::string& token = "") {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  RawResult result;
  auto call = stub.PrepareCall(&context, method, &cq);
  // One operation at a time; each is waited for before the next.
  auto wait = [&cq] {
    void* tag;
    bool ok = false;
    cq.Next(&tag, &ok);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = wait();
  for (const std::string& message : messages) {
    if (!open) break;
    grpc::Slice slice(message);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    open = wait();
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    wait();
  }
  while (true) {
    grpc::ByteBuffer buffer;
    call->Read(&buffer, reinterpret_cast<void*>(4));
    if (!wait()) break;
    std::vector<grpc::Slice> slices;
    (void)buffer.Dump(&slices);
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    result.responses.push_back(std::move(bytes));
  }
  call->Finish(&result.status, reinterpret_cast<void*>(5));
  wait();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

}  // namespace mx_test
