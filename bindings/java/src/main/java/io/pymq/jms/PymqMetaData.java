package io.pymq.jms;

import jakarta.jms.ConnectionMetaData;

import java.util.Collections;
import java.util.Enumeration;
import java.util.List;

/** Connection metadata: Jakarta Messaging 3.1, provider "pymq" (the broker's version as it reports it). */
final class PymqMetaData implements ConnectionMetaData {
    static final String PROVIDER_VERSION = "0.1.0";

    private final String server;

    PymqMetaData(String server) {
        this.server = server;
    }

    @Override
    public String getJMSVersion() {
        return "3.1";
    }

    @Override
    public int getJMSMajorVersion() {
        return 3;
    }

    @Override
    public int getJMSMinorVersion() {
        return 1;
    }

    @Override
    public String getJMSProviderName() {
        return "pymq (broker " + server + ")";
    }

    @Override
    public String getProviderVersion() {
        return PROVIDER_VERSION;
    }

    @Override
    public int getProviderMajorVersion() {
        return 0;
    }

    @Override
    public int getProviderMinorVersion() {
        return 1;
    }

    /** The JMSX properties pymq carries: group id and sequence (routing), delivery count (the broker's). */
    @Override
    public Enumeration<String> getJMSXPropertyNames() {
        return Collections.enumeration(List.of("JMSXGroupID", "JMSXGroupSeq", "JMSXDeliveryCount"));
    }
}
