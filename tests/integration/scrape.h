// Copyright 2024 The psrt Authors.
//
// What a Prometheus scraper does to a psrt daemon: GET /metrics over HTTP or
// HTTPS (libcurl), and the sample names and values of the answer.
#ifndef PSRT_TESTS_INTEGRATION_SCRAPE_H_
#define PSRT_TESTS_INTEGRATION_SCRAPE_H_

#include <map>
#include <string>

namespace psrt {

// PEM files for an HTTPS scrape: the CA that signed the server's certificate
// and, optionally, the scraper's own certificate and key.
struct ScrapeTls {
  std::string ca;
  std::string cert;
  std::string key;
  // Checked against the server's certificate instead of the URL's host.
  std::string server_name;
};

struct ScrapeResult {
  long status = 0;  // HTTP status; 0 when no answer came
  std::string body;
  std::string error;  // libcurl's message when no answer came
};

// GET `url` within 10 seconds.
ScrapeResult Scrape(const std::string& url, const ScrapeTls& tls = {});

// Sample name (with its labels, as written) -> value, for every sample line
// of a text-format answer.
std::map<std::string, double> ParseSamples(const std::string& text);

// The value of the unlabelled sample `name`, or -1 when there is none.
double SampleValue(const std::string& text, const std::string& name);

}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_SCRAPE_H_
