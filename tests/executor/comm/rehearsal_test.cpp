// The rehearsal's stand-in for CUDA and NCCL (Note [rehearsal]) under the
// device communicator, on 2 ranks (mpirun -np 2): results, groups, stream and
// event order, and the rules it enforces failing fast.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"
#include "executor/comm/rehearsal.h"
#include "tests/executor/comm/mpi_world.h"

namespace rannc::comm {
namespace {

/// A device communicator over every rank on a fresh stand-in.
std::unique_ptr<Communicator> rehearsed(const RehearsalOptions &options = {}, bool nccl = true) {
  auto device = createRehearsalDevice(world(), options);
  return createDeviceCommunicator(world().split(0, world().rank()), device, /*stream=*/nullptr, nccl);
}

Buffer deviceFloats(std::vector<float> &v) {
  return Buffer{v.data(), int64_t(v.size()), DType::Float32, Memory::Device};
}

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string failureOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

TEST(Rehearsal, TakesCpuTensorsAsDeviceMemory) {
  auto dev = rehearsed();
  EXPECT_EQ(tensorMemory(*dev, false), Memory::Device);
  EXPECT_EQ(tensorMemory(world(), false), Memory::Host);
  EXPECT_EQ(tensorMemory(world(), true), Memory::Device);
}

TEST(Rehearsal, CollectivesAgreeWithTheirDefinition) {
  ASSERT_EQ(world().size(), 2);
  const int r = world().rank();
  for (bool nccl : {true, false}) { // over the stand-in, and staged through host memory
    auto dev = rehearsed({}, nccl);
    std::vector<float> sum{float(r + 1), float(10 * (r + 1))}; // rank 0: 1,10; rank 1: 2,20
    dev->allReduce(deviceFloats(sum), ReduceOp::Sum);
    EXPECT_EQ(sum, (std::vector<float>{3, 30}));
    std::vector<float> max{float(r), float(-r)};
    dev->startAllReduce(deviceFloats(max), ReduceOp::Max)->wait();
    EXPECT_EQ(max, (std::vector<float>{1, 0}));
    // Blocks of 2: rank r's front gets block r summed: rank 0 1+3, 2+4; rank 1 10+30, 20+40.
    std::vector<float> scatter = r == 0 ? std::vector<float>{1, 2, 10, 20} : std::vector<float>{3, 4, 30, 40};
    dev->startReduceScatter(deviceFloats(scatter))->wait();
    EXPECT_EQ(scatter[0], r == 0 ? 4 : 40);
    EXPECT_EQ(scatter[1], r == 0 ? 6 : 60);
    std::vector<float> gather(4, -1);
    gather[size_t(2 * r)] = float(r + 5);
    gather[size_t(2 * r + 1)] = float(r + 7);
    dev->startAllGather(deviceFloats(gather))->wait();
    EXPECT_EQ(gather, (std::vector<float>{5, 7, 6, 8}));
  }
}

// Two ranks exchanging, and a rank sending to itself, inside a group.
TEST(Rehearsal, GroupedMessagesRunTogether) {
  const int r = world().rank(), peer = 1 - r;
  auto dev = rehearsed();
  auto mine = std::make_shared<std::vector<double>>(2, double(r + 1));
  std::vector<double> theirs(2, 0), self(2, 0);
  dev->groupStart();
  dev->sendBytes(Payload{mine->data(), 16, mine, Memory::Device}, peer, 0);
  dev->sendBytes(Payload{mine->data(), 16, mine, Memory::Device}, r, 0);
  dev->recvInto(theirs.data(), 16, Memory::Device, peer, 0);
  dev->recvInto(self.data(), 16, Memory::Device, r, 0);
  dev->groupEnd(); // the compute stream (the host) waits for the received bytes
  EXPECT_EQ(theirs, std::vector<double>(2, double(peer + 1)));
  EXPECT_EQ(self, std::vector<double>(2, double(r + 1)));
  dev->waitSends();
}

// A stream waiting for another's event runs nothing after the wait until that
// event's work is done; a receive is done only when the peer sends; work
// reads its input when it runs.
TEST(Rehearsal, EventsOrderStreams) {
  const int r = world().rank();
  auto api = createRehearsalDevice(world(), {});
  auto sub = world().split(0, r);
  auto nccl = api->initComm(*sub);
  void *s = api->createStream(), *t = api->createStream();
  int received = 0, copied = 0, value = 42;
  if (r == 0) {
    nccl->recv(&received, sizeof received, 1, t);
    void *e = api->recordEvent(t);
    api->streamWaitEvent(s, e);
    api->copy(&copied, &received, sizeof copied, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(api->eventDone(e)); // rank 1 has not sent yet
    EXPECT_EQ(copied, 0);
    world().barrier();
    api->synchronize(s);
    EXPECT_TRUE(api->eventDone(e));
    EXPECT_EQ(copied, 42);
    api->destroyEvent(e);
  } else {
    world().barrier();
    nccl->send(&value, sizeof value, 0, t);
    api->synchronize(t);
  }
  api->destroyStream(s);
  api->destroyStream(t);
}

// Rank 1 issues two collectives in the other order: both ranks fail at the
// first, at once, naming the communicator, the call and what each issued.
TEST(Rehearsal, ReorderedCollectivesFailAtOnce) {
  const int r = world().rank();
  auto dev = rehearsed({/*stall_s=*/60});
  std::vector<float> a(8, 1), b(4, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string failure = failureOf([&] {
    std::unique_ptr<Request> first, second;
    if (r == 0) {
      first = dev->startAllReduce(deviceFloats(a), ReduceOp::Sum);
      second = dev->startAllGather(deviceFloats(b));
    } else {
      first = dev->startAllGather(deviceFloats(b));
      second = dev->startAllReduce(deviceFloats(a), ReduceOp::Sum);
    }
    first->wait();
    second->wait();
  });
  EXPECT_LT(secondsSince(start), 5.0);
  EXPECT_NE(failure.find("NCCL calls out of order on device communicator 0 (world ranks 0,1): its collective #1 is "
                         "rank 0: ncclAllReduce of 8 floats (sum); rank 1: ncclAllGather of 2 floats per rank"),
            std::string::npos)
      << failure;
}

// A receive and a send that need each other but are not grouped hang NCCL;
// the stand-in reports it after stall_s with every rank's state.
TEST(Rehearsal, UngroupedExchangeIsReportedNotHung) {
  const int r = world().rank(), peer = 1 - r;
  auto dev = rehearsed({/*stall_s=*/1.5});
  auto mine = std::make_shared<std::vector<double>>(1, 1.0);
  double theirs = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::string failure = failureOf([&] {
    dev->recvInto(&theirs, 8, Memory::Device, peer, 0); // the host waits here: the send below is never issued
    dev->sendBytes(Payload{mine->data(), 8, mine, Memory::Device}, peer, 0);
  });
  EXPECT_LT(secondsSince(start), 8.0);
  EXPECT_NE(failure.find("rehearsal: rank " + std::to_string(r) + " has waited 1 s for an event of stream 0"),
            std::string::npos)
      << failure;
  for (int k : {0, 1})
    EXPECT_NE(failure.find("rank " + std::to_string(k) + ": host waiting for an event of stream 0; stream 0 (1 queued) "
                           "at device communicator 0 (world ranks 0,1) launch #1: ncclRecv of 8 bytes from rank " +
                           std::to_string(1 - k) + ", waiting for the peers' matching calls"),
              std::string::npos)
        << failure;
  world().barrier(); // both have reported before either stand-in goes
}

} // namespace
} // namespace rannc::comm
