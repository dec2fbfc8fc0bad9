// The rehearsal's stand-in for CUDA and NCCL over MPI (Note [rehearsal]).
#include "executor/comm/rehearsal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/mpi_handle.h"

namespace rannc::comm {
namespace {

using Clock = std::chrono::steady_clock;
using Lock = std::unique_lock<std::mutex>;

constexpr int kTagData = 1;  ///< point-to-point bytes on a communicator's own MPI communicator
constexpr int kTagQuery = 2; ///< "what are you doing?" on the device's diagnostic communicator
constexpr int kTagState = 3; ///< the answer

void check(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string("rehearsal: ") + what + " failed: " + std::string(msg, size_t(len)));
}

int mpiCount(size_t n) {
  if (n > size_t(INT_MAX)) throw std::runtime_error("rehearsal: an operation of 2^31 elements or more");
  return int(n);
}

enum class OpKind : int64_t { Send, Recv, AllReduce, ReduceScatter, AllGather };

const char *opName(OpKind k) {
  static const char *const names[] = {"ncclSend", "ncclRecv", "ncclAllReduce", "ncclReduceScatter",
                                      "ncclAllGather"};
  return names[size_t(k)];
}

/// One NCCL operation as issued: its inputs are read when it runs.
struct Op {
  OpKind kind = OpKind::Send;
  int peer = -1;          ///< point to point: the peer's rank in the communicator
  const void *in = nullptr;
  void *out = nullptr;
  size_t count = 0;       ///< bytes (point to point) or floats (collectives: per rank for the blocked ones)
  ReduceOp op = ReduceOp::Sum;
  std::vector<char> in_copy, out_copy; ///< what the operation reads and writes while it runs
};

class RehearsalComm;
struct Stream;

/// One piece of work queued on a stream.
struct Item {
  enum class Kind { Launch, Copy, Wait } kind = Kind::Launch;
  RehearsalComm *comm = nullptr; ///< Launch: one kernel, a collective or a group's messages
  std::vector<Op> ops;
  int64_t number = 0;            ///< Launch: the collective's or the message launch's number on comm
  void *dst = nullptr;           ///< Copy
  const void *src = nullptr;
  size_t bytes = 0;
  Stream *on = nullptr;          ///< Wait: for `on`'s work up to `seq`
  int64_t seq = 0;
  int phase = 0;                 ///< 0 queued; 1 started (collectives: comparing); 2 collectives: moving data
  std::vector<MPI_Request> requests;
  std::vector<int64_t> calls;    ///< collectives: every rank's description of its call
};

struct Stream {
  std::deque<std::unique_ptr<Item>> queue;
  int64_t enqueued = 0, completed = 0;
  int number = 0;
};

/// An event: `stream`'s work up to `seq` (null stream: the host, always done).
struct EventRec {
  Stream *stream = nullptr;
  int64_t seq = 0;
};

class RehearsalDevice;

/// A NCCL communicator: an MPI communicator of its own over the same ranks.
class RehearsalComm final : public NcclComm {
public:
  RehearsalComm(RehearsalDevice &device, Communicator &host, int number);
  ~RehearsalComm() override;
  void send(const void *data, size_t bytes, int peer, void *stream) override;
  void recv(void *data, size_t bytes, int peer, void *stream) override;
  void allReduce(float *data, size_t count, ReduceOp op, void *stream) override;
  void reduceScatter(const float *in, float *out, size_t block, void *stream) override;
  void allGather(const float *in, float *out, size_t block, void *stream) override;

  MPI_Comm mpi() const { return mpi_; }
  int size() const { return int(world_ranks_.size()); }
  /// "device communicator 3 (world ranks 0,2)".
  const std::string &name() const { return name_; }
  int worldRank(int r) const { return world_ranks_[size_t(r)]; }

  int64_t collectives = 0, messages = 0; ///< launches issued so far (under the device's lock)
  std::unique_ptr<Item> held;            ///< the swap hook's held-back collective
  Stream *held_on = nullptr;

private:
  RehearsalDevice &device_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::vector<int> world_ranks_;
  std::string name_;
};

class RehearsalDevice final : public DeviceApi {
public:
  RehearsalDevice(Communicator &world, const RehearsalOptions &options) : options_(options) {
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE)
      throw std::runtime_error("rehearsal: the MPI library does not provide MPI_THREAD_MULTIPLE, which the "
                               "stand-in's progress thread needs");
    check(MPI_Comm_dup(mpiHandle(world), &diag_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(diag_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(diag_, &rank_);
    MPI_Comm_size(diag_, &size_);
    thread_ = std::thread([this] { run(); });
  }

  ~RehearsalDevice() override {
    {
      Lock lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&diag_);
  }

  void *createStream() override {
    Lock lock(mutex_);
    streams_.push_back(std::make_unique<Stream>());
    streams_.back()->number = streams_made_++;
    return streams_.back().get();
  }
  void destroyStream(void *stream) override {
    Lock lock(mutex_);
    auto it = std::find_if(streams_.begin(), streams_.end(), [&](const auto &s) { return s.get() == stream; });
    if (it != streams_.end()) streams_.erase(it);
  }
  void *recordEvent(void *stream) override {
    Lock lock(mutex_);
    raiseFailure();
    auto *s = static_cast<Stream *>(stream);
    return new EventRec{s, s ? s->enqueued : 0};
  }
  void destroyEvent(void *event) override { delete static_cast<EventRec *>(event); }
  bool eventDone(void *event) override {
    Lock lock(mutex_);
    raiseFailure();
    return done(*static_cast<EventRec *>(event));
  }
  void streamWaitEvent(void *stream, void *event) override {
    const EventRec e = *static_cast<EventRec *>(event);
    Lock lock(mutex_);
    raiseFailure();
    if (!stream) return hostWait(lock, [&] { return done(e); }, [&] { return "an event of " + streamName(e.stream); });
    if (!e.stream) return; // the host's work is done already
    auto item = std::make_unique<Item>();
    item->kind = Item::Kind::Wait;
    item->on = e.stream;
    item->seq = e.seq;
    enqueue(std::move(item), static_cast<Stream *>(stream));
  }
  void synchronize(void *stream) override {
    auto *s = static_cast<Stream *>(stream);
    Lock lock(mutex_);
    raiseFailure();
    if (s) hostWait(lock, [&] { return s->completed == s->enqueued; }, [&] { return streamName(s) + " to finish"; });
  }
  void copy(void *dst, const void *src, size_t bytes, void *stream) override {
    Lock lock(mutex_);
    raiseFailure();
    if (!stream) return void(std::memcpy(dst, src, bytes));
    auto item = std::make_unique<Item>();
    item->kind = Item::Kind::Copy;
    item->dst = dst;
    item->src = src;
    item->bytes = bytes;
    enqueue(std::move(item), static_cast<Stream *>(stream));
  }
  void groupStart() override {
    Lock lock(mutex_);
    ++group_depth_;
  }
  void groupEnd() override {
    Lock lock(mutex_);
    if (group_depth_ == 0) throw std::logic_error("rehearsal: ncclGroupEnd without ncclGroupStart");
    if (--group_depth_ > 0) return;
    // One launch per communicator and stream, the group's messages together.
    std::vector<std::pair<Stream *, std::unique_ptr<Item>>> launches;
    for (auto &[op, comm, stream] : grouped_) {
      auto it = std::find_if(launches.begin(), launches.end(),
                             [&](const auto &l) { return l.first == stream && l.second->comm == comm; });
      if (it == launches.end()) {
        launches.emplace_back(stream, launchOf(comm));
        it = launches.end() - 1;
      }
      it->second->ops.push_back(std::move(op));
    }
    grouped_.clear();
    for (auto &[stream, item] : launches) enqueue(std::move(item), stream);
  }
  std::unique_ptr<NcclComm> initComm(Communicator &host) override {
    int number = 0;
    {
      Lock lock(mutex_);
      number = comms_made_++;
    }
    return std::make_unique<RehearsalComm>(*this, host, number);
  }
  bool deviceMemoryIsHost() const override { return true; }

  /// A message (ncclSend/ncclRecv) issued on `comm`: into the open group, or a launch of its own.
  void issueMessage(RehearsalComm &comm, Op op, void *stream) {
    Lock lock(mutex_);
    raiseFailure();
    requireStream(stream, op.kind);
    if (group_depth_ > 0) return grouped_.push_back({std::move(op), &comm, static_cast<Stream *>(stream)});
    auto item = launchOf(&comm);
    item->ops.push_back(std::move(op));
    enqueue(std::move(item), static_cast<Stream *>(stream));
  }

  /// A collective issued on `comm` (the swap hook may hold it back one call).
  void issueCollective(RehearsalComm &comm, Op op, void *stream) {
    Lock lock(mutex_);
    raiseFailure();
    requireStream(stream, op.kind);
    auto item = std::make_unique<Item>();
    item->comm = &comm;
    item->ops.push_back(std::move(op));
    auto *s = static_cast<Stream *>(stream);
    if (rank_ == options_.swap_rank && !swapped_ && comm.collectives + 1 == options_.swap_call) {
      comm.held = std::move(item);
      comm.held_on = s;
      swapped_ = true;
      return;
    }
    enqueueCollective(std::move(item), s);
    if (comm.held) enqueueCollective(std::move(comm.held), comm.held_on);
  }

  /// Ends a communicator: its queued work is done, or the job is failing and
  /// what it started is cancelled (MPI would wait for it at MPI_Finalize).
  void forget(RehearsalComm &comm) {
    Lock lock(mutex_);
    for (auto &s : streams_)
      for (auto &item : s->queue) {
        if (item->comm != &comm) continue;
        item->comm = nullptr; // step() fails on it
        for (MPI_Request &r : item->requests)
          if (r != MPI_REQUEST_NULL) MPI_Cancel(&r), MPI_Request_free(&r);
      }
  }

  int worldRank() const { return rank_; }
  MPI_Comm diag() const { return diag_; }

private:
  std::unique_ptr<Item> launchOf(RehearsalComm *comm) {
    auto item = std::make_unique<Item>();
    item->comm = comm;
    item->number = ++comm->messages;
    return item;
  }
  void requireStream(void *stream, OpKind k) const {
    if (!stream)
      throw std::logic_error(std::string("rehearsal: ") + opName(k) +
                             " on the compute stream (the device communicator issues NCCL work on its own)");
  }
  /// Collectives are numbered as queued: the swap hook's reorder is what NCCL would see.
  void enqueueCollective(std::unique_ptr<Item> item, Stream *s) {
    item->number = ++item->comm->collectives;
    enqueue(std::move(item), s);
  }
  void enqueue(std::unique_ptr<Item> item, Stream *s) {
    s->queue.push_back(std::move(item));
    ++s->enqueued;
    work_.notify_all();
  }
  static bool done(const EventRec &e) { return !e.stream || e.stream->completed >= e.seq; }
  void raiseFailure() const {
    if (!failure_.empty()) throw std::runtime_error(failure_);
  }
  std::string streamName(const Stream *s) const {
    return s ? "stream " + std::to_string(s->number) : std::string("the compute stream");
  }

  /// The host waits until `ready`, failing after stall_s with every rank's state.
  template <typename Ready, typename What> void hostWait(Lock &lock, Ready ready, What what) {
    const auto start = Clock::now();
    const auto stall = std::chrono::duration<double>(options_.stall_s);
    host_waits_for_ = what();
    while (!ready()) {
      if (!failure_.empty()) host_waits_for_.clear();
      raiseFailure();
      if (Clock::now() - start > stall) {
        const double waited = std::chrono::duration<double>(Clock::now() - start).count();
        failure_ = stallReport(lock, waited);
        raiseFailure();
      }
      progressed_.wait_for(lock, std::chrono::milliseconds(20));
    }
    host_waits_for_.clear();
  }

  // --- the progress thread: the device's part ------------------------------

  void run() {
    Lock lock(mutex_);
    while (!stop_) {
      bool busy = false, moved = false;
      if (failure_.empty()) {
        try {
          for (auto &s : streams_) moved |= advance(*s), busy |= !s->queue.empty();
        } catch (const std::exception &e) {
          failure_ = e.what();
        }
      }
      answerQueries();
      if (moved || !failure_.empty()) progressed_.notify_all();
      if (moved) continue;
      // MPI moves data only inside MPI calls: poll while work is in flight.
      if (busy) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lock.lock();
      } else {
        work_.wait_for(lock, std::chrono::milliseconds(10));
      }
    }
  }

  /// Runs `s`'s queue as far as it goes; true when an item completed.
  bool advance(Stream &s) {
    bool moved = false;
    while (!s.queue.empty() && step(*s.queue.front())) {
      s.queue.pop_front();
      ++s.completed;
      moved = true;
    }
    return moved;
  }

  /// Moves `it` on; true when it is complete.
  bool step(Item &it) {
    switch (it.kind) {
    case Item::Kind::Copy: std::memcpy(it.dst, it.src, it.bytes); return true;
    case Item::Kind::Wait: return done(EventRec{it.on, it.seq});
    case Item::Kind::Launch: break;
    }
    if (!it.comm) throw std::runtime_error("rehearsal: a communicator was destroyed with work queued on it");
    const bool collective = it.ops.front().kind != OpKind::Send && it.ops.front().kind != OpKind::Recv;
    if (it.phase == 0) {
      it.phase = 1;
      if (collective) startComparing(it);
      else startMessages(it);
    }
    std::vector<MPI_Status> statuses(it.requests.size());
    int complete = 0;
    const int rc = MPI_Testall(int(it.requests.size()), it.requests.data(), &complete, statuses.data());
    if (rc != MPI_SUCCESS && !collective) throw std::runtime_error(messageSizeError(it, statuses));
    check(rc, "MPI_Testall");
    if (!complete) return false;
    if (collective && it.phase == 1) {
      compareCalls(it);
      it.phase = 2;
      startCollective(it);
      return false;
    }
    if (!collective) checkSizes(it, statuses);
    for (Op &op : it.ops)
      if (!op.out_copy.empty()) std::memcpy(op.out, op.out_copy.data(), op.out_copy.size());
    return true;
  }

  void startMessages(Item &it) {
    MPI_Comm c = it.comm->mpi();
    for (Op &op : it.ops) {
      it.requests.push_back(MPI_REQUEST_NULL);
      if (op.kind == OpKind::Send) {
        op.in_copy.assign(static_cast<const char *>(op.in), static_cast<const char *>(op.in) + op.count);
        check(MPI_Issend(op.in_copy.data(), mpiCount(op.count), MPI_BYTE, op.peer, kTagData, c, &it.requests.back()),
              "MPI_Issend");
      } else {
        op.out_copy.resize(op.count);
        check(MPI_Irecv(op.out_copy.data(), mpiCount(op.count), MPI_BYTE, op.peer, kTagData, c, &it.requests.back()),
              "MPI_Irecv");
      }
    }
  }

  /// The description every rank's call of one collective must agree on.
  static std::vector<int64_t> callOf(const Item &it) {
    const Op &op = it.ops.front();
    return {int64_t(op.kind), int64_t(op.count), int64_t(op.op)};
  }
  static std::string describeCall(const std::vector<int64_t> &c) {
    const auto kind = OpKind(c[0]);
    std::string s = std::string(opName(kind)) + " of " + std::to_string(c[1]) + " floats";
    if (kind == OpKind::ReduceScatter || kind == OpKind::AllGather) s += " per rank";
    if (kind == OpKind::AllReduce) s += ReduceOp(c[2]) == ReduceOp::Max ? " (max)" : " (sum)";
    return s;
  }

  void startComparing(Item &it) {
    auto mine = callOf(it);
    it.calls.assign(mine.size() * size_t(it.comm->size()), 0);
    it.ops.front().in_copy.assign(reinterpret_cast<char *>(mine.data()),
                                  reinterpret_cast<char *>(mine.data() + mine.size()));
    it.requests.assign(1, MPI_REQUEST_NULL);
    check(MPI_Iallgather(it.ops.front().in_copy.data(), int(mine.size()), MPI_INT64_T, it.calls.data(),
                         int(mine.size()), MPI_INT64_T, it.comm->mpi(), &it.requests.back()),
          "MPI_Iallgather");
  }

  /// Fails when the ranks issued different collectives as this one.
  void compareCalls(const Item &it) const {
    const size_t n = callOf(it).size();
    std::map<std::vector<int64_t>, std::vector<int>> by_call;
    for (int r = 0; r < it.comm->size(); ++r)
      by_call[std::vector<int64_t>(it.calls.begin() + long(r * n), it.calls.begin() + long((r + 1) * n))].push_back(
          it.comm->worldRank(r));
    if (by_call.size() == 1) return;
    std::ostringstream msg;
    msg << "rehearsal: NCCL calls out of order on " << it.comm->name() << ": its collective #" << it.number
        << " is";
    bool first = true;
    for (const auto &[call, ranks] : by_call) {
      msg << (first ? " " : "; ") << "rank" << (ranks.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < ranks.size(); ++i) msg << (i ? "," : "") << ranks[i];
      msg << ": " << describeCall(call);
      first = false;
    }
    msg << ". Every rank must issue the same collectives in the same order on a communicator; NCCL would hang "
           "or mix the data here.";
    throw std::runtime_error(msg.str());
  }

  void startCollective(Item &it) {
    Op &op = it.ops.front();
    const int n = it.comm->size();
    MPI_Comm c = it.comm->mpi();
    const auto *in = static_cast<const char *>(op.in);
    const size_t in_floats = op.kind == OpKind::ReduceScatter ? op.count * size_t(n) : op.count;
    const size_t out_floats = op.kind == OpKind::AllGather ? op.count * size_t(n) : op.count;
    op.in_copy.assign(in, in + in_floats * sizeof(float));
    op.out_copy.resize(out_floats * sizeof(float));
    it.requests.assign(1, MPI_REQUEST_NULL);
    MPI_Request *req = &it.requests.back();
    auto *send = reinterpret_cast<float *>(op.in_copy.data());
    auto *recv = reinterpret_cast<float *>(op.out_copy.data());
    switch (op.kind) {
    case OpKind::AllReduce:
      check(MPI_Iallreduce(send, recv, mpiCount(op.count), MPI_FLOAT, op.op == ReduceOp::Max ? MPI_MAX : MPI_SUM, c,
                           req),
            "MPI_Iallreduce");
      break;
    case OpKind::ReduceScatter:
      check(MPI_Ireduce_scatter_block(send, recv, mpiCount(op.count), MPI_FLOAT, MPI_SUM, c, req),
            "MPI_Ireduce_scatter_block");
      break;
    case OpKind::AllGather:
      check(MPI_Iallgather(send, mpiCount(op.count), MPI_FLOAT, recv, mpiCount(op.count), MPI_FLOAT, c, req),
            "MPI_Iallgather");
      break;
    default: throw std::logic_error("rehearsal: not a collective");
    }
  }

  std::string messageSizeError(const Item &it, const std::vector<MPI_Status> &statuses) const {
    for (size_t i = 0; i < it.ops.size(); ++i)
      if (it.ops[i].kind == OpKind::Recv && statuses[i].MPI_ERROR != MPI_SUCCESS &&
          statuses[i].MPI_ERROR != MPI_ERR_PENDING)
        return "rehearsal: on " + it.comm->name() + ", rank " + std::to_string(rank_) + "'s ncclRecv of " +
               std::to_string(it.ops[i].count) + " bytes from rank " +
               std::to_string(it.comm->worldRank(it.ops[i].peer)) +
               " met a larger ncclSend (NCCL needs the sizes to match)";
    return "rehearsal: on " + it.comm->name() + ", a message failed";
  }

  void checkSizes(const Item &it, const std::vector<MPI_Status> &statuses) const {
    for (size_t i = 0; i < it.ops.size(); ++i) {
      if (it.ops[i].kind != OpKind::Recv) continue;
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (size_t(got) != it.ops[i].count)
        throw std::runtime_error("rehearsal: on " + it.comm->name() + ", rank " + std::to_string(rank_) +
                                 "'s ncclRecv of " + std::to_string(it.ops[i].count) + " bytes from rank " +
                                 std::to_string(it.comm->worldRank(it.ops[i].peer)) + " got " + std::to_string(got) +
                                 " (NCCL needs the sizes to match)");
    }
  }

  // --- hangs ----------------------------------------------------------------

  /// This rank's state in words: what the host waits for, each stream's head.
  std::string state() const {
    std::ostringstream s;
    s << "rank " << rank_ << ": host "
      << (host_waits_for_.empty() ? "not waiting on the device (computing, or in a host message)"
                                  : "waiting for " + host_waits_for_);
    for (const auto &st : streams_) {
      if (st->queue.empty()) continue;
      const Item &it = *st->queue.front();
      s << "; " << streamName(st.get()) << " (" << st->queue.size() << " queued) at ";
      if (it.kind == Item::Kind::Copy) s << "a copy";
      else if (it.kind == Item::Kind::Wait) s << "a wait for " << streamName(it.on);
      else if (!it.comm) s << "work of a destroyed communicator";
      else if (it.ops.front().kind != OpKind::Send && it.ops.front().kind != OpKind::Recv)
        s << it.comm->name() << " collective #" << it.number << ", " << describeCall(callOf(it))
          << (it.phase == 1 ? ", waiting for the other ranks to reach a collective" : "");
      else {
        s << it.comm->name() << " launch #" << it.number << (it.ops.size() > 1 ? " (a group)" : "") << ":";
        for (const Op &op : it.ops)
          s << " " << opName(op.kind) << " of " << op.count << " bytes " << (op.kind == OpKind::Send ? "to" : "from")
            << " rank " << it.comm->worldRank(op.peer);
        s << ", waiting for the peers' matching calls";
      }
    }
    return s.str();
  }

  /// Answers other ranks' "what are you doing?" (progress thread, locked).
  void answerQueries() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kTagQuery, diag_, &flag, &status) != MPI_SUCCESS || !flag) return;
      char dummy = 0;
      MPI_Recv(&dummy, 1, MPI_CHAR, status.MPI_SOURCE, kTagQuery, diag_, MPI_STATUS_IGNORE);
      const std::string mine = state();
      MPI_Send(mine.data(), int(mine.size()), MPI_CHAR, status.MPI_SOURCE, kTagState, diag_);
    }
  }

  /// Asks every rank for its state (for up to 2 s) and puts the answers together.
  std::string stallReport(Lock &lock, double waited) {
    std::ostringstream msg;
    msg << "rehearsal: rank " << rank_ << " has waited " << int(waited) << " s for " << host_waits_for_
        << ": a hang NCCL would have too. Every rank's state (one line: rannc-exec prints one): [" << state() << "]";
    lock.unlock(); // the progress thread answers other ranks meanwhile
    char query = 1;
    std::vector<MPI_Request> asks(size_t(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) MPI_Isend(&query, 1, MPI_CHAR, r, kTagQuery, diag_, &asks[size_t(r)]);
    std::map<int, std::string> answers;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (int(answers.size()) < size_ - 1 && Clock::now() < deadline) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagState, diag_, &flag, &status);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      int len = 0;
      MPI_Get_count(&status, MPI_CHAR, &len);
      std::string text(size_t(len), '\0');
      MPI_Recv(text.data(), len, MPI_CHAR, status.MPI_SOURCE, kTagState, diag_, MPI_STATUS_IGNORE);
      answers[status.MPI_SOURCE] = text;
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (answers.count(r)) msg << " [" << answers[r] << "]";
      else msg << " [rank " << r << ": no answer]";
      int done = 0;
      if (asks[size_t(r)] != MPI_REQUEST_NULL) MPI_Test(&asks[size_t(r)], &done, MPI_STATUS_IGNORE);
      if (!done && asks[size_t(r)] != MPI_REQUEST_NULL) MPI_Request_free(&asks[size_t(r)]);
    }
    lock.lock();
    return msg.str();
  }

  RehearsalOptions options_;
  MPI_Comm diag_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;                       ///< guards everything below
  std::condition_variable work_;           ///< the host queued work
  std::condition_variable progressed_;     ///< an item completed, or the device failed
  std::list<std::unique_ptr<Stream>> streams_;
  int streams_made_ = 0;
  int comms_made_ = 0;
  int group_depth_ = 0;
  struct Grouped {
    Op op;
    RehearsalComm *comm;
    Stream *stream;
  };
  std::vector<Grouped> grouped_;           ///< messages of the open group
  bool swapped_ = false;
  std::string failure_;                    ///< the first rule broken; every later call throws it
  std::string host_waits_for_;
  bool stop_ = false;
  std::thread thread_;
};

RehearsalComm::RehearsalComm(RehearsalDevice &device, Communicator &host, int number) : device_(device) {
  check(MPI_Comm_dup(mpiHandle(host), &mpi_), "MPI_Comm_dup"); // collective, as ncclCommInitRank
  MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
  MPI_Group mine, world;
  MPI_Comm_group(mpi_, &mine);
  MPI_Comm_group(device.diag(), &world);
  int n = 0;
  MPI_Group_size(mine, &n);
  std::vector<int> ranks(size_t(n), 0);
  for (int r = 0; r < n; ++r) ranks[size_t(r)] = r;
  world_ranks_.resize(size_t(n));
  MPI_Group_translate_ranks(mine, n, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  name_ = "device communicator " + std::to_string(number) + " (world ranks ";
  for (int r = 0; r < n; ++r) name_ += (r ? "," : "") + std::to_string(world_ranks_[size_t(r)]);
  name_ += ")";
}

RehearsalComm::~RehearsalComm() {
  device_.forget(*this);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&mpi_);
}

void RehearsalComm::send(const void *data, size_t bytes, int peer, void *stream) {
  device_.issueMessage(*this, Op{OpKind::Send, peer, data, nullptr, bytes}, stream);
}

void RehearsalComm::recv(void *data, size_t bytes, int peer, void *stream) {
  device_.issueMessage(*this, Op{OpKind::Recv, peer, nullptr, data, bytes}, stream);
}

void RehearsalComm::allReduce(float *data, size_t count, ReduceOp reduce, void *stream) {
  device_.issueCollective(*this, Op{OpKind::AllReduce, -1, data, data, count, reduce}, stream);
}

void RehearsalComm::reduceScatter(const float *in, float *out, size_t block, void *stream) {
  device_.issueCollective(*this, Op{OpKind::ReduceScatter, -1, in, out, block}, stream);
}

void RehearsalComm::allGather(const float *in, float *out, size_t block, void *stream) {
  device_.issueCollective(*this, Op{OpKind::AllGather, -1, in, out, block}, stream);
}

} // namespace

std::shared_ptr<DeviceApi> createRehearsalDevice(Communicator &world, const RehearsalOptions &options) {
  return std::make_shared<RehearsalDevice>(world, options);
}

} // namespace rannc::comm
