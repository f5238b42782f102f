// horovod_cpp — Apache-2.0
// The Gloo backend's control mesh (ops/tcp_mesh.h), with threads as ranks over loopback and
// an in-memory store: every call's result against values computed here, messages larger than
// a socket's buffer in both directions at once, a stranger during set-up, a peer that leaves
// and one that stays silent.
#include "ops/tcp_mesh.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hvd {
namespace ops {
namespace {

using namespace std::chrono_literals;

// The rendezvous store: set, and a get that waits for the key.
class MemoryStore {
 public:
  TcpMesh::SetFn Setter() {
    return [this](const std::string& key, const std::vector<char>& value) {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
      cv_.notify_all();
      return Status::OK();
    };
  }
  TcpMesh::GetFn Getter() {
    return [this](const std::string& key) -> Result<std::vector<char>> {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, 5s, [&] { return values_.count(key) > 0; })) {
        return Status::DeadlineExceeded("no " + key);
      }
      return values_[key];
    };
  }
  std::vector<char> Peek(const std::string& key) { return Getter()(key).value(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> values_;
};

sockaddr_storage Loopback(socklen_t* len) {
  sockaddr_storage addr{};
  auto* in = reinterpret_cast<sockaddr_in*>(&addr);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  *len = sizeof(sockaddr_in);
  return addr;
}

// Rank `rank`'s mesh over loopback, or null (the failure reported).
std::unique_ptr<TcpMesh> ConnectRank(MemoryStore* store, int rank, int size,
                                     std::chrono::milliseconds timeout) {
  socklen_t len = 0;
  const sockaddr_storage addr = Loopback(&len);
  Result<std::unique_ptr<TcpMesh>> mesh =
      TcpMesh::Connect(addr, len, rank, size, timeout, store->Setter(), store->Getter());
  EXPECT_TRUE(mesh.ok()) << mesh.status().ToString();
  return mesh.ok() ? std::move(mesh).value() : nullptr;
}

// Runs body(rank, mesh) on `size` threads, each with its own connected mesh.
void OnRanks(int size, std::chrono::milliseconds timeout,
             const std::function<void(int, TcpMesh&)>& body) {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<TcpMesh> mesh = ConnectRank(&store, r, size, timeout);
      if (mesh) body(r, *mesh);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<uint8_t> MessageOf(int rank, size_t len) {
  std::vector<uint8_t> m(len);
  for (size_t i = 0; i < len; ++i) m[i] = static_cast<uint8_t>(rank * 31 + i * 7);
  return m;
}

TEST(TcpMesh, EveryCallDeliversWhatEachRankSent) {
  for (int size : {1, 2, 3, 4}) {
    OnRanks(size, 10s, [size](int rank, TcpMesh& mesh) {
      // Fixed blocks, in place.
      std::vector<uint64_t> words(static_cast<size_t>(size) * 2);
      words[static_cast<size_t>(rank) * 2] = 100 + rank;
      words[static_cast<size_t>(rank) * 2 + 1] = 1000 * rank;
      const char* at = reinterpret_cast<const char*>(words.data()) + rank * 16;
      ASSERT_TRUE(mesh.Allgather(at, 16, reinterpret_cast<char*>(words.data()), "t").ok());
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(words[static_cast<size_t>(r) * 2], static_cast<uint64_t>(100 + r));
        EXPECT_EQ(words[static_cast<size_t>(r) * 2 + 1], static_cast<uint64_t>(1000 * r));
      }
      // Blocks of every rank's own length (rank r sends 3 r bytes), at offsets out of order.
      std::vector<size_t> lens, offsets;
      size_t total = 0;
      for (int r = size - 1; r >= 0; --r) total += 3 * static_cast<size_t>(r);
      lens.resize(static_cast<size_t>(size));
      offsets.resize(static_cast<size_t>(size));
      size_t next = 0;
      for (int r = size - 1; r >= 0; --r) {
        lens[static_cast<size_t>(r)] = 3 * static_cast<size_t>(r);
        offsets[static_cast<size_t>(r)] = next;
        next += lens[static_cast<size_t>(r)];
      }
      std::vector<char> out(total);
      const std::vector<uint8_t> mine = MessageOf(rank, lens[static_cast<size_t>(rank)]);
      ASSERT_TRUE(mesh.AllgatherInto(mine.data(), lens, offsets, out.data(), "t").ok());
      for (int r = 0; r < size; ++r) {
        const std::vector<uint8_t> theirs = MessageOf(r, lens[static_cast<size_t>(r)]);
        if (theirs.empty()) continue;
        EXPECT_EQ(0, std::memcmp(out.data() + offsets[static_cast<size_t>(r)], theirs.data(),
                                 theirs.size()))
            << "rank " << r << "'s block at rank " << rank;
      }
      // Messages of any length: gathered, gathered everywhere, broadcast from every root.
      const std::vector<uint8_t> message = MessageOf(rank, 5 + 600 * static_cast<size_t>(rank));
      std::vector<std::vector<uint8_t>> all;
      ASSERT_TRUE(mesh.AllgatherV(message, &all, "t").ok());
      ASSERT_EQ(all.size(), static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(all[static_cast<size_t>(r)], MessageOf(r, 5 + 600 * static_cast<size_t>(r)));
      }
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<uint8_t>> at_root;
        ASSERT_TRUE(mesh.Gather(message, root, &at_root, "t").ok());
        if (rank == root) {
          EXPECT_EQ(at_root, all);
        } else {
          EXPECT_TRUE(at_root.empty());
        }
        std::vector<uint8_t> b = rank == root ? MessageOf(root, 77 * (root + 1))
                                              : std::vector<uint8_t>{1, 2, 3};
        ASSERT_TRUE(mesh.Broadcast(&b, root, "t").ok());
        EXPECT_EQ(b, MessageOf(root, 77 * (static_cast<size_t>(root) + 1)));
      }
      // An empty message.
      std::vector<uint8_t> none;
      ASSERT_TRUE(mesh.Broadcast(&none, 0, "t").ok());
      EXPECT_TRUE(none.empty());
    });
  }
}

// Every rank sends 8 MiB to every other at once: more than the sockets hold, so a rank that
// wrote everything before reading would wait for a peer doing the same.
TEST(TcpMesh, MessagesLargerThanTheSocketsBuffersCrossWithoutWaitingOnEachOther) {
  constexpr size_t kBytes = size_t{8} << 20;
  OnRanks(3, 20s, [](int rank, TcpMesh& mesh) {
    std::vector<char> out(3 * kBytes);
    std::vector<char> mine(kBytes);
    for (size_t i = 0; i < kBytes; ++i) mine[i] = static_cast<char>(rank + i / 4096);
    ASSERT_TRUE(mesh.Allgather(mine.data(), kBytes, out.data(), "big").ok());
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < kBytes; i += 4093) {
        ASSERT_EQ(out[static_cast<size_t>(r) * kBytes + i], static_cast<char>(r + i / 4096));
      }
    }
  });
}

// A process that connects to a rank's listening port without the token (a port scanner, a
// stray client) is closed, and the mesh still forms.
TEST(TcpMesh, AStrangerDuringSetUpIsClosedAndTheMeshStillForms) {
  MemoryStore store;
  std::unique_ptr<TcpMesh> mesh0, mesh1;
  std::thread rank0([&] { mesh0 = ConnectRank(&store, 0, 2, 10s); });
  // The stranger: reads rank 0's address (as a scanner would find the port), sends a hello
  // with a wrong token, and another connection that sends nothing at all.
  const std::vector<char> entry = store.Peek("0");
  sockaddr_storage addr{};
  std::memcpy(&addr, entry.data(), sizeof(sockaddr_in));
  int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(0, ::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(sockaddr_in)));
  int wrong = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(0, ::connect(wrong, reinterpret_cast<sockaddr*>(&addr), sizeof(sockaddr_in)));
  char hello[24] = {'H', 'V', 'D', 'M', 1, 0, 0, 0};  // rank 1, a token of zeros
  EXPECT_EQ(24, ::send(wrong, hello, sizeof(hello), 0));
  char answer = 0;
  EXPECT_EQ(0, ::recv(wrong, &answer, 1, 0)) << "the wrong token was not refused";
  std::thread rank1([&] { mesh1 = ConnectRank(&store, 1, 2, 10s); });
  rank0.join();
  rank1.join();
  ::close(silent);
  ::close(wrong);
  ASSERT_TRUE(mesh0 && mesh1);
  std::vector<uint8_t> b0{9, 8, 7}, b1;
  std::thread t([&] { EXPECT_TRUE(mesh1->Broadcast(&b1, 0, "t").ok()); });
  EXPECT_TRUE(mesh0->Broadcast(&b0, 0, "t").ok());
  t.join();
  EXPECT_EQ(b1, b0);
}

// A rank whose mesh closes (its process ended) fails its peers' calls at once, not after the
// timeout, and every later call fails with the same error.
TEST(TcpMesh, APeerThatLeavesFailsTheCallAtOnceAndTheMeshStaysFailed) {
  OnRanks(3, 30s, [](int rank, TcpMesh& mesh) {
    if (rank == 2) return;  // its mesh is destroyed when this returns
    const auto start = std::chrono::steady_clock::now();
    std::vector<uint64_t> words(3);
    Status s = mesh.Allgather(&rank, sizeof(rank), reinterpret_cast<char*>(words.data()), "vote");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    std::vector<uint8_t> b{1};
    Status again = mesh.Broadcast(&b, 0, "after");
    EXPECT_EQ(again.ToString(), s.ToString());
  });
}

// A rank whose call failed tells its peers why before it stops: their errors name the cause,
// not only the rank whose connection closed. And a rank that stops for a reason of its own
// (Leave, as the backend calls it when its loop ends with an error) does the same.
TEST(TcpMesh, ARankThatStopsTellsItsPeersWhy) {
  OnRanks(3, 30s, [](int rank, TcpMesh& mesh) {
    if (rank == 2) return;  // gone
    std::vector<std::vector<uint8_t>> at_root;
    Status gathered = mesh.Gather({static_cast<uint8_t>(rank)}, 0, &at_root, "gather of bytes");
    if (rank == 0) {  // waited for rank 2 too
      EXPECT_NE(gathered.message().find("gather of bytes with rank 2 failed: the connection "
                                        "was closed"), std::string::npos) << gathered.ToString();
      return;
    }
    EXPECT_TRUE(gathered.ok()) << gathered.ToString();  // rank 1 only sent
    std::vector<uint8_t> b;
    Status s = mesh.Broadcast(&b, 0, "broadcast of bytes");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("control mesh broadcast of bytes with rank 0 failed: it stopped "
                               "after an error: control mesh gather of bytes with rank 2 failed: "
                               "the connection was closed"), std::string::npos)
        << s.ToString();
  });
  OnRanks(2, 30s, [](int rank, TcpMesh& mesh) {
    if (rank == 1) {
      mesh.Leave("collective timeout: rank 1 waited 10 s");  // then its mesh closes
      return;
    }
    std::vector<uint8_t> b;
    Status s = mesh.Broadcast(&b, 1, "broadcast of bytes");
    EXPECT_NE(s.message().find("with rank 1 failed: it stopped after an error: collective "
                               "timeout: rank 1 waited 10 s"), std::string::npos)
        << s.ToString();
  });
}

// A peer that stays connected but never answers fails the call after the timeout, naming it.
TEST(TcpMesh, ASilentPeerFailsTheCallAfterTheTimeout) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  OnRanks(2, 300ms, [&](int rank, TcpMesh& mesh) {
    if (rank == 1) {  // connected, silent until rank 0 has given up
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, 10s, [&] { return done; });
      return;
    }
    std::vector<uint8_t> b;
    const auto start = std::chrono::steady_clock::now();
    Status s = mesh.Broadcast(&b, 1, "broadcast of bytes");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("no progress with ranks 1 within 0.3 s"), std::string::npos)
        << s.ToString();
    EXPECT_GE(took, 250ms);
    EXPECT_LT(took, 5s);
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
}

}  // namespace
}  // namespace ops
}  // namespace hvd
