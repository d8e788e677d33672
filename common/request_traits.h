#ifndef PSRT_COMMON_REQUEST_TRAITS_H_
#define PSRT_COMMON_REQUEST_TRAITS_H_

// A request whose bytes are not a valid message of its type is the caller's
// error: INVALID_ARGUMENT naming the type, where gRPC's protobuf
// deserialization answers INTERNAL. gRPC's generated sync handlers and stubs
// (de)serialize every message through SerializationTraits<MessageLite>, so
// this specialization of it is what psrt's services use: the generated
// psrt/v1/*.grpc.pb.h include this header first (grpc_cpp_plugin's
// additional_header_includes), so every file that uses them sees it before
// any use. Serializing, and reading anything but a request (a *Request
// type), stay protobuf's own.

#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>

namespace grpc {

template <>
class SerializationTraits<protobuf::MessageLite, void> {
 public:
  static Status Serialize(const protobuf::MessageLite& msg, ByteBuffer* bb, bool* own_buffer) {
    return GenericSerialize<ProtoBufferWriter, protobuf::MessageLite>(msg, bb, own_buffer);
  }
  static Status Deserialize(ByteBuffer* buffer, protobuf::MessageLite* msg) {
    Status s = GenericDeserialize<ProtoBufferReader, protobuf::MessageLite>(buffer, msg);
    const std::string type = msg->GetTypeName();
    const bool request = type.size() > 7 && type.compare(type.size() - 7, 7, "Request") == 0;
    if (s.error_code() != StatusCode::INTERNAL || !request) return s;
    return Status(StatusCode::INVALID_ARGUMENT, "the request's bytes are not a valid " + type + " message");
  }
};

}  // namespace grpc

#endif  // PSRT_COMMON_REQUEST_TRAITS_H_
