// Mutual TLS: a whole job over TLS, and peers without the job's certificate
// refused at the handshake. Certificates are made with the openssl command.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "tests/integration/job_util.h"
#include "tests/integration/scrape.h"

namespace psrt {
namespace {

// Runs `cmd` through the shell; fails the test unless it exits 0.
void Sh(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }

// A CA and a certificate it signed for 127.0.0.1 and the name psrt.job, as
// DIR/NAME-ca.pem, DIR/NAME.pem and DIR/NAME.key.
void MakeCertificates(const std::string& dir, const std::string& name) {
  const std::string p = dir + "/" + name;
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  Sh(absl::StrCat("printf 'subjectAltName=IP:127.0.0.1,DNS:psrt.job\\n' >", p, ".ext"));
  Sh(absl::StrCat("openssl req -x509", ec, " -keyout ", p, "-ca.key -out ", p, "-ca.pem -days 2 -subj /CN=", name,
                  "-ca 2>/dev/null"));
  Sh(absl::StrCat("openssl req", ec, " -keyout ", p, ".key -out ", p, ".csr -subj /CN=", name, " 2>/dev/null"));
  Sh(absl::StrCat("openssl x509 -req -in ", p, ".csr -CA ", p, "-ca.pem -CAkey ", p, "-ca.key -CAcreateserial -out ", p,
                  ".pem -days 2 -extfile ", p, ".ext 2>/dev/null"));
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(std::system("openssl version >/dev/null 2>&1"), 0) << "no openssl command (scripts/setup.sh installs it)";
    dir_ = TempDir();
    MakeCertificates(dir_, "job");
    MakeCertificates(dir_, "other");
  }
  std::string Env(const std::string& cert = "job", const std::string& ca = "job") const {
    return absl::StrCat("env PSRT_TLS_CA=", dir_, "/", ca, "-ca.pem PSRT_TLS_CERT=", dir_, "/", cert,
                        ".pem PSRT_TLS_KEY=", dir_, "/", cert, ".key ");
  }
  std::string Pem(const std::string& name) const { return ReadFile(dir_ + "/" + name); }

  std::string dir_;
};

TEST_F(TlsTest, AJobTrainsOverMutualTls) {
  Proc job =
      Proc::Start(absl::StrCat(kBin, "/psrt-run --local=2 --tls-ca=", dir_, "/job-ca.pem --tls-cert=", dir_,
                               "/job.pem --tls-key=", dir_, "/job.key -- ", kBin, "/psrt-example-linreg --steps=30"),
                  dir_ + "/job.log");
  ASSERT_EQ(job.Wait(absl::Seconds(120), "TLS job"), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_TRUE(absl::StrContains(out, "(sync mode, mutual TLS)")) << out;
  EXPECT_TRUE(absl::StrContains(out, "2 workers, mutual TLS)")) << out;
  EXPECT_TRUE(absl::StrContains(out, "job succeeded")) << out;

  // The same through one name for every server (PSRT_TLS_SERVER_NAME).
  Proc named = Proc::Start(absl::StrCat(Env(), "PSRT_TLS_SERVER_NAME=psrt.job ", kBin, "/psrt-run --local=1 -- ", kBin,
                                        "/psrt-example-linreg --steps=10"),
                           dir_ + "/named.log");
  EXPECT_EQ(named.Wait(absl::Seconds(120), "TLS job with a server name"), 0) << named.Output();
  // A name the certificate does not hold fails the handshake: the job ends
  // with the reason instead of training in the clear.
  Proc wrong =
      Proc::Start(absl::StrCat(Env(), "PSRT_TLS_SERVER_NAME=elsewhere ", kBin,
                               "/psrt-run --local=1 --distribution='{\"parameter_server\": {\"enabled\": true, "
                               "\"barrier_timeout_s\": 3}}' -- ",
                               kBin, "/psrt-example-linreg --steps=10"),
                  dir_ + "/wrong.log");
  EXPECT_NE(wrong.Wait(absl::Seconds(120), "TLS job with a wrong server name"), 0) << wrong.Output();
  EXPECT_FALSE(absl::StrContains(wrong.Output(), "job succeeded")) << wrong.Output();
}

// A standalone coordinator speaking mutual TLS; only a client presenting a
// certificate the job's CA signed gets an answer.
TEST_F(TlsTest, PeersWithoutTheJobsCertificateAreRefused) {
  const std::string port_file = dir_ + "/port";
  Proc coordinator =
      Proc::Start(absl::StrCat(Env(), kBin, "/psrt-coordinator --bind=127.0.0.1 --port=0 --port-file=", port_file,
                               " --hosts=localhost"),
                  dir_ + "/coordinator.log");
  ASSERT_TRUE(coordinator.WaitForOutput("mutual TLS", absl::Seconds(30))) << coordinator.Output();
  const std::string address = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(ReadFile(port_file)));

  auto call = [&](std::shared_ptr<grpc::ChannelCredentials> credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a fresh connection per case
    auto stub = v1::Coordinator::NewStub(grpc::CreateCustomChannel(address, credentials, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::JobStatusResponse resp;
    return stub->GetJobStatus(&ctx, v1::JobStatusRequest(), &resp);
  };
  auto tls = [&](const std::string& ca, const std::string& cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Pem(ca + "-ca.pem");
    if (!cert.empty()) {
      o.pem_cert_chain = Pem(cert + ".pem");
      o.pem_private_key = Pem(cert + ".key");
    }
    return grpc::SslCredentials(o);
  };
  grpc::Status s = call(tls("job", "job"));
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = call(grpc::InsecureChannelCredentials());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "plaintext: " << s.error_message();
  s = call(tls("job", ""));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "no client certificate: " << s.error_message();
  s = call(tls("job", "other"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "another CA's certificate: " << s.error_message();
  s = call(tls("other", "job"));  // the client does not trust the server
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "server of another CA: " << s.error_message();

  // A server checking the coordinator against a name its certificate does
  // not hold gives up, saying what to check.
  Proc server = Proc::Start(absl::StrCat(Env(), "PSRT_TLS_SERVER_NAME=elsewhere ", kBin,
                                         "/psrt-server --coordinator=", address, " --index=0 --connect-timeout=2"),
                            dir_ + "/server.log");
  EXPECT_EQ(server.Wait(absl::Seconds(60), "psrt-server"), 1) << server.Output();
  EXPECT_TRUE(absl::StrContains(server.Output(), "could not reach the coordinator at " + address)) << server.Output();
  EXPECT_TRUE(absl::StrContains(server.Output(), "or PSRT_TLS_SERVER_NAME)")) << server.Output();

  kill(coordinator.pid, SIGTERM);
  coordinator.Wait(absl::Seconds(30), "psrt-coordinator");
}

// /metrics of a TLS job: HTTPS with the job's certificate, answered only to
// scrapers presenting a certificate the job's CA signed.
TEST_F(TlsTest, MetricsAreServedOverMutualTls) {
  const int port = PickFreePort();
  Proc run = Proc::Start(absl::StrCat(Env(), kBin, "/psrt-run --local=1 --metrics-port=", port, " -- ", kBin,
                                      "/psrt-example-linreg --steps=100000000 --log-every=10"),
                         dir_ + "/metrics.log");
  ASSERT_TRUE(run.WaitForOutput("step 20 ", absl::Seconds(60))) << run.Output();
  std::smatch m;
  const std::string out = run.Output();
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(psrt-server\[0\] I metrics at (https://127\.0\.0\.1:[0-9]+/metrics) \(mutual TLS\))")))
      << out;
  const std::string server = m[1];
  const std::string coordinator = absl::StrCat("https://127.0.0.1:", port, "/metrics");
  EXPECT_TRUE(absl::StrContains(out, "psrt-coordinator I metrics at " + coordinator + " (mutual TLS)")) << out;

  const ScrapeTls job{dir_ + "/job-ca.pem", dir_ + "/job.pem", dir_ + "/job.key"};
  const ScrapeResult first = Scrape(server, job);
  ASSERT_EQ(first.status, 200) << first.error;
  const double pushed = SampleValue(first.body, "psrt_server_bytes_in_total");
  EXPECT_GT(pushed, 0) << first.body;
  // The job goes on pushing: a later scrape sees more.
  ASSERT_TRUE(run.WaitForOutput("step 60 ", absl::Seconds(60))) << run.Output();
  const ScrapeResult second = Scrape(server, job);
  ASSERT_EQ(second.status, 200) << second.error;
  EXPECT_GT(SampleValue(second.body, "psrt_server_bytes_in_total"), pushed) << second.body;
  const ScrapeResult coordinator_scrape = Scrape(coordinator, job);
  ASSERT_EQ(coordinator_scrape.status, 200) << coordinator_scrape.error;
  EXPECT_GT(SampleValue(coordinator_scrape.body, "psrt_coordinator_heartbeats_total"), 0) << coordinator_scrape.body;
  // The certificate names psrt.job too: a scraper can check that name.
  ScrapeTls by_name = job;
  by_name.server_name = "psrt.job";
  EXPECT_EQ(Scrape(server, by_name).status, 200);

  // Refused: plain HTTP, no client certificate, another CA's certificate, a
  // scraper that does not trust the job's CA.
  std::string plain = server;
  plain.replace(0, 5, "http");
  const ScrapeResult refused[] = {
      Scrape(plain),
      Scrape(server, {dir_ + "/job-ca.pem", "", ""}),
      Scrape(server, {dir_ + "/job-ca.pem", dir_ + "/other.pem", dir_ + "/other.key"}),
      Scrape(server, {dir_ + "/other-ca.pem", dir_ + "/job.pem", dir_ + "/job.key"}),
  };
  for (const ScrapeResult& r : refused) {
    EXPECT_NE(r.status, 200) << r.body;
    EXPECT_FALSE(absl::StrContains(r.body, "psrt_server_")) << r.body;
  }
  // And the server answers its scrapers as before.
  EXPECT_EQ(Scrape(server, job).status, 200);
  // Another daemon asked for a port /metrics already has does not start.
  Proc another = Proc::Start(absl::StrCat(Env(), kBin, "/psrt-coordinator --bind=127.0.0.1 --port=0 --metrics-port=",
                                          port, " --hosts=localhost"),
                             dir_ + "/another.log");
  EXPECT_EQ(another.Wait(absl::Seconds(30), "a second psrt-coordinator"), 1) << another.Output();
  EXPECT_TRUE(absl::StrContains(another.Output(), "metrics: cannot listen at " + coordinator)) << another.Output();

  kill(run.pid, SIGTERM);
  EXPECT_EQ(run.Wait(absl::Seconds(30), "psrt-run after SIGTERM"), 1);
}

TEST_F(TlsTest, BadSettingsStopEveryProgramAtStartNamingTheFile) {
  struct Case {
    std::string env, why;
  };
  const std::string d = dir_ + "/";
  const Case cases[] = {
      {"PSRT_TLS_CERT=" + d + "job.pem", "needs PSRT_TLS_CA, PSRT_TLS_CERT and PSRT_TLS_KEY together"},
      {Env().substr(4) + "PSRT_TLS_CA=" + d + "missing.pem", "PSRT_TLS_CA: cannot read '" + d + "missing.pem'"},
      {Env().substr(4) + "PSRT_TLS_CA=" + d + "job.ext", "holds no PEM certificate"},
      {Env().substr(4) + "PSRT_TLS_KEY=" + d + "other.key", "is not the key of the certificate in '" + d + "job.pem'"},
      {Env("job", "other").substr(4), "does not verify against PSRT_TLS_CA '" + d + "other-ca.pem'"},
      {"PSRT_TLS_SERVER_NAME=psrt.job", "PSRT_TLS_SERVER_NAME is set without"},
  };
  for (const Case& c : cases) {
    for (const std::string program : {"psrt-run --local=1 -- true", "psrt-coordinator --port=0",
                                      "psrt-server --coordinator=127.0.0.1:1 --index=0"}) {
      Proc p = Proc::Start(absl::StrCat("env ", c.env, " ", kBin, "/", program), dir_ + "/bad.log");
      EXPECT_EQ(p.Wait(absl::Seconds(30), program), 2) << c.env << "\n" << p.Output();
      EXPECT_TRUE(absl::StrContains(p.Output(), c.why)) << program << " with " << c.env << ":\n" << p.Output();
    }
  }
  // The flags of psrt-run are the same settings.
  Proc p = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=1 --tls-cert=", d, "job.pem -- true"), dir_ + "/flag.log");
  EXPECT_EQ(p.Wait(absl::Seconds(30), "psrt-run --tls-cert"), 2);
  EXPECT_TRUE(absl::StrContains(p.Output(), "PSRT_TLS_CA and PSRT_TLS_KEY not set")) << p.Output();
}

}  // namespace
}  // namespace psrt
